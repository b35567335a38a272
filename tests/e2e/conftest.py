"""Fixtures of the REST end-to-end tests: a real server (``actorserve.serve``) on
127.0.0.1 port 0 in the test's nursery, real clients, and small models the tests steer.

``server`` serves the built-in models plus the models below. Parametrize it indirectly
with ``"fast"`` (default: infer on the raw-ASGI fast path) or ``"quart"`` (infer through
Quart) to run a test against both front doors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import attrs
import httpx
import numpy as np
import pytest
import trio
from support.models import GateModel

from actorserve import BatchModel, InferenceRequest, InferenceResponse, Model, ModelSettings, StepOutput
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.model import int_parameter
from actorserve.models import builtin_settings as builtin_models
from actorserve.server.composition import Server, serve
from actorserve.settings import SequenceSettings, Settings

#: Bound on every wait in these tests: a hang fails the test instead of freezing the run.
TIMEOUT = 20.0


class FailingModel(Model):
    """Streams ``ok`` good responses (default 0), then raises (a model bug)."""

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            for k in range(int_parameter(request, "ok", 0, minimum=0)):
                yield self.response(request, [tensor_from_numpy("index", np.array([k], dtype=np.int64))])
            raise RuntimeError("the model broke")


@attrs.define
class Count:
    request: InferenceRequest
    n: int
    k: int = 0


class CountingBatchModel(BatchModel[None, Count]):
    """A streaming BatchModel: request with parameter ``n`` gets n responses, one per
    step, each with output ``k`` (int64) and ``replica`` (which replica stepped it)."""

    default_max_batch_size = 8
    _replicas = 0

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.replica = CountingBatchModel._replicas
        CountingBatchModel._replicas += 1

    def begin(self, request: InferenceRequest, state: None) -> Count:
        return Count(request, int_parameter(request, "n", 3, minimum=1, maximum=100_000))

    def step(self, batch: list[Count]) -> list[StepOutput]:
        outputs = []
        for work in batch:
            tensors = [
                tensor_from_numpy("k", np.array([work.k], dtype=np.int64)),
                tensor_from_numpy("replica", np.array([self.replica], dtype=np.int64)),
            ]
            work.k += 1
            outputs.append(StepOutput(self.response(work.request, tensors), done=work.k >= work.n))
        return outputs


#: The light built-in models (the text model loads torch weights: its own tests cover it).
LIGHT_BUILTINS = ("identity", "streamer", "accumulator")


def rest_models() -> tuple[ModelSettings, ...]:
    return (
        *(m for m in builtin_models() if m.name in LIGHT_BUILTINS),
        ModelSettings(name="gate", implementation=GateModel, sequence=SequenceSettings(max_queue=1)),
        ModelSettings(name="failing", implementation=FailingModel),
        ModelSettings(name="counter", implementation=CountingBatchModel, workers=2),
    )


def rest_settings(**changes: Any) -> Settings:
    """Settings of a test server: 127.0.0.1, HTTP on port 0, no gRPC, :func:`rest_models`,
    no token needed (the auth tests in test_auth.py turn it on)."""
    values: dict[str, Any] = {
        "http_port": 0,
        "grpc_port": None,
        "host": "127.0.0.1",
        "models": rest_models(),
        "no_auth": True,
    }
    values.update(changes)
    return Settings(**values)


@pytest.fixture
def make_settings() -> Callable[..., Settings]:
    """:func:`rest_settings`, for tests that run ``serve`` in their own nursery."""
    return rest_settings


Launch = Callable[..., Awaitable[Server]]


@pytest.fixture
def launch(nursery: trio.Nursery) -> Launch:
    """``await launch(fast_path=True, **settings_changes)``: one more server in the
    test's nursery (stopped by cancellation when the test ends)."""

    async def start(*, fast_path: bool = True, **changes: Any) -> Server:
        settings = rest_settings(**changes)
        server: Server = await nursery.start(partial(serve, settings, rest_fast_path=fast_path))
        return server

    return start


@pytest.fixture
async def server(request: pytest.FixtureRequest, launch: Launch) -> Server:
    mode = getattr(request, "param", "fast")
    assert mode in ("fast", "quart"), mode
    return await launch(fast_path=mode == "fast")


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture
def gate(server: Server) -> GateModel:
    """The ``gate`` model instance serving requests in ``server``."""
    model = server.engine.model("gate")
    assert isinstance(model, GateModel)
    return model


async def leftover_work(engine: Engine) -> dict[str, Any]:
    """What is still running in the engine, per model (empty when all is quiet). Open
    sequences are not counted: a disconnect leaves them open on purpose."""
    busy: dict[str, Any] = {}
    for info in await engine.models():
        stats = await engine.statistics(info.name, info.version)
        work = {"inflight": stats.inflight, "waiting": stats.waiting, "running": stats.running}
        if any(work.values()):
            busy[info.name] = work
    return busy


Settle = Callable[..., Awaitable[None]]


@pytest.fixture
def settle(server: Server) -> Settle:
    """``await settle()``: wait (bounded by TIMEOUT) until the engine of ``server`` (or
    the one passed) has no request in flight, waiting or in a batch."""

    async def wait(engine: Engine | None = None) -> None:
        engine = engine or server.engine
        with trio.fail_after(TIMEOUT):
            await engine.wait_idle()
        assert await leftover_work(engine) == {}

    return wait
