"""Warm-up (issue 34): a model's ``warmup`` requests run at load before the version is
ready; REST ``/v2/health/ready`` and ``/v2/models/{m}/ready`` and gRPC ServerReady /
ModelReady say ready only after them; a failing warm-up fails the load. One process
with a held warm-up (a real server on 127.0.0.1 port 0), and the multi-process shape
with a model folder whose model counts its calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, Launch
from support.servers import start_server

from actorserve import InferenceRequest, InferenceResponse, Model, ModelFailed, ModelSettings
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.model import text_input
from actorserve.textgen import TextGeneration, text_tensor

WARMUP = [
    {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [7]}]},
    {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [8]}], "parameters": {"p": 1}},
]


class HeldWarmup(Model):
    """Counts its calls (output ``calls``); a warm-up request (id ``warmup-N``) waits for
    the class's ``gate``; input 7 with parameter ``fail`` raises."""

    gate: ClassVar[trio.Event | None] = None
    seen: ClassVar[list[tuple[str | None, int]]] = []
    #: set once two requests have arrived
    two_arrived: ClassVar[trio.Event] = trio.Event()

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.calls = 0

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        self.calls += 1
        x = int(np.asarray(request.inputs[0].data).reshape(-1)[0])
        HeldWarmup.seen.append((request.id, x))
        if len(HeldWarmup.seen) == 2:
            HeldWarmup.two_arrived.set()
        if request.parameters.get("fail"):
            raise RuntimeError("the warm-up found a broken kernel")
        gate = HeldWarmup.gate
        if gate is not None and (request.id or "").startswith("warmup-"):
            await gate.wait()
        return self.response(request, [tensor_from_numpy("calls", np.array([self.calls], dtype=np.int64))])


def held_settings(**changes: Any) -> ModelSettings:
    values: dict[str, Any] = {"name": "warm", "implementation": HeldWarmup, "warmup": tuple(WARMUP)}
    values.update(changes)
    return ModelSettings(**values)


async def readiness(http: httpx.AsyncClient, target: str) -> dict[str, object]:
    def grpc_ready() -> tuple[bool, bool]:
        with grpcclient.InferenceServerClient(target) as c:
            return c.is_server_ready(), c.is_model_ready("warm")

    server, model = await trio.to_thread.run_sync(grpc_ready)
    return {
        "rest_server": (await http.get("/v2/health/ready")).status_code,
        "rest_model": (await http.get("/v2/models/warm/ready")).status_code,
        "grpc_server": server,
        "grpc_model": model,
    }


async def test_a_version_is_ready_only_after_its_warmup(launch: Launch) -> None:
    HeldWarmup.gate, HeldWarmup.seen, HeldWarmup.two_arrived = trio.Event(), [], trio.Event()
    server = await launch(grpc_port=0)
    engine = server.engine
    assert isinstance(engine, Engine) and server.http_url is not None and server.grpc_address is not None
    host, port = server.grpc_address[:2]
    target = f"{host}:{port}"
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as http:
        assert (await readiness(http, target))["rest_server"] == 200
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.load, held_settings(workers=2))
                await HeldWarmup.two_arrived.wait()  # the first entry, on both replicas
                held = await readiness(http, target)
                assert held["rest_model"] != 200
                assert {**held, "rest_model": None} == {
                    "rest_server": 503,
                    "rest_model": None,
                    "grpc_server": False,
                    "grpc_model": False,
                }
                HeldWarmup.gate.set()
        # each entry once per replica, in order: the first entry on both, then the second
        assert sorted(HeldWarmup.seen[:2]) == [("warmup-0", 7)] * 2
        assert sorted(HeldWarmup.seen[2:]) == [("warmup-1", 8)] * 2
        assert await readiness(http, target) == {
            "rest_server": 200,
            "rest_model": 200,
            "grpc_server": True,
            "grpc_model": True,
        }
        body = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}]}
        answered = await http.post("/v2/models/warm/infer", json=body)
        assert answered.json()["outputs"][0]["data"] == [3]  # two warm-ups, then this one


async def test_a_failing_warmup_fails_the_load(launch: Launch) -> None:
    HeldWarmup.gate, HeldWarmup.seen = None, []
    server = await launch()
    engine = server.engine
    assert isinstance(engine, Engine)
    broken = (WARMUP[0], {**WARMUP[0], "parameters": {"fail": True}})
    with pytest.raises(ModelFailed) as failed:
        await engine.load(held_settings(warmup=broken))
    assert failed.value.message == (
        "loading model 'warm' failed: WarmupFailed: 'warmup[1]' failed:"
        " model 'warm' failed: RuntimeError: the warm-up found a broken kernel"
    )
    assert "warm" not in {m.name for m in await engine.models() if m.state == "READY"}


class Prompts(Model):
    """Records the prompts it was asked (its ``text_input``)."""

    text_generation = TextGeneration(input="prompt")
    prompts: ClassVar[list[str]] = []

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        Prompts.prompts.append(text_input(request, "prompt"))
        return self.response(request, [text_tensor("text_output", "ok")])


async def test_a_text_warmup_is_the_prompt_of_a_text_model(launch: Launch) -> None:
    Prompts.prompts = []
    engine = (await launch()).engine
    assert isinstance(engine, Engine)
    await engine.load(ModelSettings(name="prompts", implementation=Prompts, warmup=("Once upon", "a time")))
    assert Prompts.prompts == ["Once upon", "a time"]
    with pytest.raises(ModelFailed) as failed:  # a text needs a model that takes text
        await engine.load(held_settings(name="untexted", warmup=("hi",)))
    assert failed.value.message == (
        "loading model 'untexted' failed: BadInput: 'warmup[0]' is a text, but the model declares no text_generation"
    )


MODEL = '''
import numpy as np
from actorserve import Model
from actorserve.codecs import tensor_from_numpy


class Calls(Model):
    """Answers how many requests it has served (its warm-ups count)."""

    def __init__(self, settings):
        super().__init__(settings)
        self.calls = 0

    async def predict(self, request):
        self.calls += 1
        return self.response(request, [tensor_from_numpy("calls", np.array([self.calls], dtype=np.int64))])
'''


def test_the_warmup_runs_in_the_engine_process(tmp_path: Path) -> None:
    folder = tmp_path / "calls"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL)
    settings = {"name": "calls", "implementation": "model.Calls", "warmup": [*WARMUP, WARMUP[0]]}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    server = start_server(
        "--http-port", "0", "--grpc-port", "0", "--api-workers", "1", "--no-auth", str(tmp_path)
    )
    try:
        url = server.wait_for(r"processes: REST listening on (http://\S+)", 60)[1]
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/v2/health/ready").status_code == 200
            body = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}]}
            assert http.post("/v2/models/calls/infer", json=body).json()["outputs"][0]["data"] == [4]
    finally:
        server.stop()


async def test_a_warmup_with_a_sequence_runs_once(launch: Launch) -> None:
    """A sequence lives on one replica: its entry is sent once, not once per replica (two
    at once would conflict on the id); one that ends its sequence leaves none open."""
    engine = (await launch()).engine
    assert isinstance(engine, Engine)
    add = {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [5]}]}
    sequence = {"sequence_id": "warm", "sequence_start": True, "sequence_end": True}
    settings = ModelSettings(
        name="summer",
        implementation="actorserve.models.accumulator.AccumulatorModel",
        workers=2,
        warmup=({**add, "parameters": sequence},),
    )
    await engine.load(settings)
    stats = await engine.statistics("summer")
    assert (stats.sequences_started, stats.open_sequences) == (1, 0)
