"""gRPC end to end with Triton's own client (``tritonclient.grpc``, synchronous, in a
worker thread) against a real server on 127.0.0.1 port 0."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.grpc as grpcclient
from e2e.grpc_fixtures import GrpcServer, grpc_server, in_thread, running_grpc_server
from support.replicas import not_held_message
from tritonclient.utils import InferenceServerException

import actorserve
from actorserve.engine.repository import ModelRepository
from actorserve.models import builtin_settings as builtin_models
from actorserve.server.doors import serve_grpc
from actorserve.settings import Settings
from actorserve.transport.grpchost.server import bind

__all__ = ["grpc_server"]

TIMEOUT = 20.0  # seconds any one client call may take before the test fails


def client(server: GrpcServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.target)


def tensor(name: str, array: np.ndarray, datatype: str | None = None) -> grpcclient.InferInput:
    dt = datatype or ("BYTES" if array.dtype == object else _DATATYPES[array.dtype])
    t = grpcclient.InferInput(name, list(array.shape), dt)
    t.set_data_from_numpy(array)
    return t


_DATATYPES = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values that exercise the type: extremes for integers, fractions for floats."""
    n = int(np.prod(shape))
    if datatype == "BYTES":
        values = [b"", b"tok\x00en", "é".encode(), b"\xff\xfe", b"x" * 300, b"last"][:n]
        out = np.empty(n, dtype=object)
        out[:] = values
        return out.reshape(shape)
    if datatype == "BOOL":
        return np.array([True, False, True, True, False, False][:n]).reshape(shape)
    dtype: Any = next(dt for dt, name in _DATATYPES.items() if name == datatype)
    numbers: list[Any]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        numbers = [info.min, info.max, 0, 1, info.max - 1, info.min + 1][:n]
    else:
        numbers = [0.5, -1.25, 3.0, float(np.finfo(dtype).max), float(np.finfo(dtype).tiny), -0.0][:n]
    return np.array(numbers, dtype=dtype).reshape(shape)


def status_of(error: InferenceServerException) -> str:
    return str(error.status())


# --------------------------------------------------------------------------- health, metadata


async def test_health_metadata_and_repository_index(grpc_server: GrpcServer) -> None:
    def scenario() -> dict[str, Any]:
        with client(grpc_server) as c:
            return {
                "live": c.is_server_live(),
                "ready": c.is_server_ready(),
                "model_ready": c.is_model_ready("identity"),
                "version_ready": c.is_model_ready("identity", "1"),
                "server": c.get_server_metadata(as_json=True),
                "model": c.get_model_metadata("streamer", as_json=True),
                "index": c.get_model_repository_index(as_json=True),
            }

    got = await in_thread(scenario)
    assert got["live"] is True
    assert got["ready"] is True
    assert got["model_ready"] is True
    assert got["version_ready"] is True
    assert got["server"] == {
        "name": "actorserve",
        "version": actorserve.__version__,
        "extensions": [
            "binary_tensor_data",
            "generate",
            "model_repository",
            "parameters",
            "sequence",
            "streaming",
        ],
    }
    assert got["model"] == {
        "name": "streamer",
        "versions": ["1"],
        "platform": "actorserve/StreamerModel",
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": ["1"]}],
        "outputs": [
            {"name": "text_output", "datatype": "BYTES", "shape": ["1"]},
            {"name": "index", "datatype": "INT64", "shape": ["1"]},
        ],
    }
    names = [(m["name"], m["version"], m["state"]) for m in got["index"]["models"]]
    assert names == sorted((m.name, "1", "READY") for m in grpc_server.settings.models)


async def test_unknown_model_is_not_found_for_every_method(grpc_server: GrpcServer) -> None:
    def scenario() -> list[tuple[str, str]]:
        errors = []
        with client(grpc_server) as c:
            calls: list[Callable[[], Any]] = [
                lambda: c.get_model_metadata("nope"),
                lambda: c.infer("nope", [tensor("INPUT0", np.zeros(1, np.int32))]),
                lambda: c.infer("identity", [tensor("INPUT0", np.zeros(1, np.int32))], model_version="7"),
                lambda: c.unload_model("nope"),
                lambda: c.load_model("nope"),
            ]
            for call in calls:
                with pytest.raises(InferenceServerException) as info:
                    call()
                errors.append((status_of(info.value), info.value.message()))
        return errors

    assert await in_thread(scenario) == [
        ("StatusCode.NOT_FOUND", "model 'nope' is not loaded"),
        ("StatusCode.NOT_FOUND", "model 'nope' is not loaded"),
        ("StatusCode.NOT_FOUND", "model 'identity' has no version '7'"),
        ("StatusCode.NOT_FOUND", "model 'nope' is not loaded"),
        ("StatusCode.NOT_FOUND", "model 'nope' is not in the model repository"),
    ]


async def test_model_ready_is_false_for_a_model_not_loaded(grpc_server: GrpcServer) -> None:
    """As Triton's ``ModelIsReady``: ``ready: false`` (no error) for an unknown model or
    version, like an unloaded one (test_repository_api.py)."""

    def scenario() -> list[bool]:
        with client(grpc_server) as c:
            return [c.is_model_ready("nope"), c.is_model_ready("identity", "7"), c.is_model_ready("identity")]

    assert await in_thread(scenario) == [False, False, True]


# --------------------------------------------------------------------------- ModelInfer


async def test_model_infer_every_datatype_and_shape(grpc_server: GrpcServer) -> None:
    datatypes = [*_DATATYPES.values(), "BYTES"]

    def scenario() -> list[str]:
        problems = []
        with client(grpc_server) as c:
            for datatype in datatypes:
                for shape in ((1,), (2, 3)):
                    data = sample(datatype, shape)
                    result = c.infer(
                        "identity",
                        [tensor("INPUT0", data, datatype)],
                        request_id=f"{datatype}{shape}",
                        client_timeout=TIMEOUT,
                    )
                    out = result.as_numpy("OUTPUT0")
                    response = result.get_response()
                    got = (out.dtype == data.dtype, out.shape, out.tolist(), response.id, response.model_name)
                    want = (True, shape, data.tolist(), f"{datatype}{shape}", "identity")
                    if got != want or response.model_version != "1":
                        problems.append(f"{datatype} {shape}: got {got}, want {want}")
        return problems

    assert await in_thread(scenario) == []


async def test_model_infer_two_inputs_and_requested_outputs(grpc_server: GrpcServer) -> None:
    def scenario() -> tuple[list[str], list[int]]:
        with client(grpc_server) as c:
            result = c.infer(
                "identity",
                [
                    tensor("INPUT0", np.array([1, 2], np.int32)),
                    tensor("INPUT1", np.array([7, 8, 9], np.int64)),
                ],
                outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
            )
            return [o.name for o in result.get_response().outputs], result.as_numpy("OUTPUT1").tolist()

    assert await in_thread(scenario) == (["OUTPUT1"], [7, 8, 9])


async def test_model_infer_passes_parameters_through(grpc_server: GrpcServer) -> None:
    def scenario() -> dict[str, Any]:
        with client(grpc_server) as c:
            result = c.infer(
                "identity",
                [tensor("INPUT0", np.array([1], np.int8))],
                parameters={"flag": True, "count": -3, "name": "x", "ratio": 0.25},
            )
            return {k: str(v).strip() for k, v in result.get_response().parameters.items()}

    assert await in_thread(scenario) == {
        "flag": "bool_param: true",
        "count": "int64_param: -3",
        "name": 'string_param: "x"',
        "ratio": "double_param: 0.25",
    }


async def test_model_infer_errors_map_to_grpc_status(grpc_server: GrpcServer) -> None:
    def scenario() -> list[tuple[str, str]]:
        errors = []
        with client(grpc_server) as c:
            one = np.array([1], np.int64)
            calls: list[Callable[[], Any]] = [
                lambda: c.infer("identity", [tensor("BOGUS", one)]),
                lambda: c.infer(
                    "identity", [tensor("INPUT0", one)], outputs=[grpcclient.InferRequestedOutput("NOPE")]
                ),
                lambda: c.infer("accumulator", [tensor("INPUT", one)], sequence_id=999),
                lambda: c.infer("accumulator", [tensor("INPUT", one)], sequence_id=5, sequence_start=True),
                lambda: c.infer("accumulator", [tensor("INPUT", one)], sequence_id=5, sequence_start=True),
                lambda: c.infer("fail", [tensor("INPUT0", one)]),
                lambda: c.infer("streamer", [], parameters={"n_tokens": -1}),
            ]
            for call in calls:
                try:
                    call()
                except InferenceServerException as exc:
                    errors.append((status_of(exc), exc.message()))
                else:
                    errors.append(("OK", ""))
        return errors

    assert await in_thread(scenario) == [
        ("StatusCode.INVALID_ARGUMENT", "model 'identity' has no input 'BOGUS' (expected INPUT0, INPUT1)"),
        (
            "StatusCode.INVALID_ARGUMENT",
            "unknown requested output 'NOPE' (model 'identity' has OUTPUT0, OUTPUT1)",
        ),
        ("StatusCode.NOT_FOUND", not_held_message("999")),
        ("OK", ""),
        ("StatusCode.ALREADY_EXISTS", "sequence '5' is already open"),
        ("StatusCode.INTERNAL", "model 'fail' failed: RuntimeError: boom"),
        ("StatusCode.INVALID_ARGUMENT", "parameter 'n_tokens': expected an integer in [0, 10000], got -1"),
    ]


async def test_overloaded_model_is_resource_exhausted(grpc_server: GrpcServer) -> None:
    """``gate1`` runs one request at a time (max_pending=1): a second one is refused."""
    model = grpc_server.model("gate1")
    results: queue.Queue[Any] = queue.Queue()

    c = client(grpc_server)
    c.async_infer(
        "gate1",
        [],
        lambda result, error: results.put((result, error)),
        request_id="held",
        parameters={"gate": "g"},
        client_timeout=TIMEOUT,
    )
    with trio.fail_after(TIMEOUT):
        await model.started["held"].wait()

    def second() -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as info:
            c.infer("gate1", [], request_id="refused")
        return status_of(info.value), info.value.message()

    assert await in_thread(second) == (
        "StatusCode.RESOURCE_EXHAUSTED",
        "model 'gate1': 1 requests already running (max_pending)",
    )
    model.gates["g"].set()
    result, error = await in_thread(lambda: results.get(timeout=TIMEOUT))
    assert error is None
    assert result.get_response().id == "held"
    c.close()
    await grpc_server.assert_quiet()


async def test_full_sequence_mailbox_is_resource_exhausted(grpc_server: GrpcServer) -> None:
    """``gateseq`` sequences queue one request (max_queue=1): with one running and one
    queued, a third is refused."""
    model = grpc_server.model("gateseq")
    results: queue.Queue[Any] = queue.Queue()

    def send(c: grpcclient.InferenceServerClient, rid: str, **kw: Any) -> None:
        c.async_infer(
            "gateseq",
            [],
            lambda result, error: results.put((rid, result, error)),
            request_id=rid,
            sequence_id=42,
            parameters={"gate": "g"},
            client_timeout=TIMEOUT,
            **kw,
        )

    c = client(grpc_server)
    send(c, "running", sequence_start=True)
    with trio.fail_after(TIMEOUT):
        await model.started["running"].wait()
    send(c, "queued")
    await grpc_server.statistics_when("gateseq", lambda s: s.queued == 1)

    def third() -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as info:
            c.infer("gateseq", [], request_id="refused", sequence_id=42)
        return status_of(info.value), info.value.message()

    assert await in_thread(third) == (
        "StatusCode.RESOURCE_EXHAUSTED",
        "sequence '42' already has 1 requests queued (max_queue)",
    )
    model.gates["g"].set()
    done = [await in_thread(lambda: results.get(timeout=TIMEOUT)) for _ in range(2)]
    assert sorted((rid, error) for rid, _, error in done) == [("queued", None), ("running", None)]
    c.close()


async def test_model_shutting_down_is_unavailable(grpc_server: GrpcServer) -> None:
    """``gate`` is being unloaded, its grace period held open by a request in flight."""
    engine, model = grpc_server.engine, grpc_server.model("gate")

    async def held() -> None:
        await engine.infer(actorserve.InferenceRequest([], id="held", parameters={"gate": "g"}), model="gate")

    def scenario() -> tuple[bool, str, str]:
        with client(grpc_server) as c:
            ready = c.is_model_ready("gate")
            with pytest.raises(InferenceServerException) as info:
                c.infer("gate", [])
            return ready, status_of(info.value), info.value.message()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(held)
        with trio.fail_after(TIMEOUT):
            await model.started["held"].wait()
        nursery.start_soon(lambda: engine.unload("gate", grace=TIMEOUT))  # waits for "held"
        with trio.fail_after(TIMEOUT):
            while (await engine.model_info("gate")).state is not actorserve.api.ModelState.UNLOADING:
                await trio.testing.wait_all_tasks_blocked()
        assert await in_thread(scenario) == (
            False,
            "StatusCode.UNAVAILABLE",
            "model 'gate' version '1' is shutting down",
        )
        model.gates["g"].set()
    assert [m.name for m in await engine.models() if m.name == "gate"] == []


async def test_repository_unload_and_load(grpc_server: GrpcServer) -> None:
    def scenario() -> list[Any]:
        with client(grpc_server) as c:
            c.unload_model("streamer")
            index = c.get_model_repository_index(as_json=True)["models"]
            before = [m["name"] for m in index if m.get("state") == "READY"]
            assert {"name": "streamer", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index
            unloaded = c.is_model_ready("streamer")  # false, not NOT_FOUND, as Triton answers
            c.load_model("streamer")
            return [before, unloaded, c.is_model_ready("streamer")]

    before, unloaded, ready = await in_thread(scenario)
    assert "streamer" not in before
    assert "identity" in before
    assert (unloaded, ready) == (False, True)


# --------------------------------------------------------------------------- ModelStreamInfer


def text(value: str) -> grpcclient.InferInput:
    return tensor("text_input", np.array([value.encode()], dtype=object), "BYTES")


def int64(name: str, value: int) -> grpcclient.InferInput:
    return tensor(name, np.array([value], dtype=np.int64))


class StreamClient:
    """tritonclient's stream with its callback results in a queue."""

    def __init__(self, server: GrpcServer, **start: Any) -> None:
        self.results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client = client(server)
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)), **start)

    def next(self) -> tuple[Any, Any]:
        return self.results.get(timeout=TIMEOUT)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


async def test_stream_streamer_tokens_with_ids(grpc_server: GrpcServer) -> None:
    def scenario() -> list[tuple[str, str, int]]:
        stream = StreamClient(grpc_server)
        stream.client.async_stream_infer(
            "streamer", [text("hi")], request_id="s1", parameters={"n_tokens": 4}
        )
        got = []
        for _ in range(4):
            result, error = stream.next()
            assert error is None
            got.append(
                (
                    result.get_response().id,
                    result.as_numpy("text_output")[0].decode(),
                    int(result.as_numpy("index")[0]),
                )
            )
        stream.close()
        return got

    assert await in_thread(scenario) == [("s1", f"hi:{k}", k) for k in range(4)]


async def test_stream_interleaved_accumulator_sequences(grpc_server: GrpcServer) -> None:
    """Two sequences (an integer and a string id) interleaved on one stream; each is
    answered in order with its own running sum."""

    def scenario() -> dict[str, list[tuple[str, int]]]:
        stream = StreamClient(grpc_server)
        plan = [
            ("a1", 7, 1, {"sequence_start": True}),
            ("b1", "bee", 10, {"sequence_start": True}),
            ("a2", 7, 2, {}),
            ("b2", "bee", 20, {}),
            ("a3", 7, 3, {"sequence_end": True}),
            ("b3", "bee", 30, {"sequence_end": True}),
        ]
        for rid, sid, value, flags in plan:
            stream.client.async_stream_infer(
                "accumulator", [int64("INPUT", value)], request_id=rid, sequence_id=sid, **flags
            )
        got: dict[str, list[tuple[str, int]]] = {"7": [], "bee": []}
        for _ in plan:
            result, error = stream.next()
            assert error is None
            response = result.get_response()
            sid = response.parameters["sequence_id"].string_param
            got[sid].append((response.id, int(result.as_numpy("OUTPUT")[0])))
        stream.close()
        return got

    assert await in_thread(scenario) == {
        "7": [("a1", 1), ("a2", 3), ("a3", 6)],
        "bee": [("b1", 10), ("b2", 30), ("b3", 60)],
    }
    assert (await grpc_server.engine.statistics("accumulator")).open_sequences == 0


async def test_stream_error_is_in_band_and_stream_stays_open(grpc_server: GrpcServer) -> None:
    def scenario() -> list[Any]:
        stream = StreamClient(grpc_server)
        stream.client.async_stream_infer("nope", [text("x")], request_id="bad")
        result, error = stream.next()
        first = (result, str(error.message()))
        stream.client.async_stream_infer(
            "accumulator", [int64("INPUT", 1)], request_id="noseq", sequence_id=31
        )
        result, error = stream.next()
        second = (result, str(error.message()))
        stream.client.async_stream_infer(
            "streamer", [text("ok")], request_id="good", parameters={"n_tokens": 1}
        )
        result, error = stream.next()
        third = (error, result.get_response().id, result.as_numpy("text_output")[0])
        stream.close()
        return [first, second, third]

    assert await in_thread(scenario) == [
        (None, "model 'nope' is not loaded"),
        (None, not_held_message("31")),
        (None, "good", b"ok:0"),
    ]


async def test_stream_triton_grpc_error_header_gives_a_status(grpc_server: GrpcServer) -> None:
    def scenario() -> tuple[Any, str, str]:
        stream = StreamClient(grpc_server, headers={"triton_grpc_error": "true"})
        stream.client.async_stream_infer("streamer", [text("a")], request_id="ok", parameters={"n_tokens": 1})
        result, error = stream.next()
        assert error is None and result.get_response().id == "ok"
        stream.client.async_stream_infer("nope", [text("x")], request_id="bad")
        result, error = stream.next()
        stream.close()
        return result, status_of(error), error.message()

    assert await in_thread(scenario) == (None, "StatusCode.NOT_FOUND", "model 'nope' is not loaded")


# --------------------------------------------------------------------------- compression


async def test_gzip_requests_and_responses_round_trip(grpc_server: GrpcServer) -> None:
    data = np.arange(5000, dtype=np.int64).reshape(50, 100)

    def scenario() -> tuple[Any, list[str]]:
        with client(grpc_server) as c:
            result = c.infer("identity", [tensor("INPUT0", data)], compression_algorithm="gzip")
            stream = StreamClient(grpc_server, compression_algorithm="gzip")
            stream.client.async_stream_infer(
                "streamer", [text("z")], request_id="z", parameters={"n_tokens": 2}
            )
            tokens = [stream.next()[0].as_numpy("text_output")[0].decode() for _ in range(2)]
            stream.close()
            return result.as_numpy("OUTPUT0").tolist(), tokens

    assert await in_thread(scenario) == (data.tolist(), ["z:0", "z:1"])


# --------------------------------------------------------------------------- through serve()


async def test_serve_starts_grpc_next_to_rest() -> None:
    settings = Settings(
        models=tuple(builtin_models()), host="127.0.0.1", http_port=0, grpc_port=0, grace_period=2.0
    )
    async with trio.open_nursery() as nursery:
        server = await nursery.start(actorserve.serve, settings)
        assert server.grpc_address is not None
        host, port = server.grpc_address

        def scenario() -> tuple[bool, list[int]]:
            with grpcclient.InferenceServerClient(f"{host}:{port}") as c:
                result = c.infer("identity", [tensor("INPUT0", np.array([4, 5], np.int16))])
                return c.is_server_ready(), result.as_numpy("OUTPUT0").tolist()

        assert await in_thread(scenario) == (True, [4, 5])
        server.shutdown()


async def test_serve_grpc_serves_on_a_socket_bound_by_the_caller() -> None:
    """With ``sock=``, serve_grpc listens there (port 0 chosen by the caller's bind) and
    leaves the socket to its owner."""
    settings = Settings(models=tuple(builtin_models()), host="127.0.0.1", http_port=None, grpc_port=None)
    listener = bind("127.0.0.1", 0)
    with listener:
        async with actorserve.open_engine(settings) as engine, trio.open_nursery() as nursery:
            address = await nursery.start(partial(serve_grpc, engine, settings, sock=listener))
            assert address == listener.getsockname()

            def scenario() -> bool:
                with grpcclient.InferenceServerClient(f"127.0.0.1:{address[1]}") as c:
                    return bool(c.is_server_ready())

            assert await in_thread(scenario) is True
            nursery.cancel_scope.cancel()
        assert listener.fileno() != -1  # not closed: the caller owns it


async def test_repository_load_finds_models_added_to_the_model_folders(tmp_path: Path) -> None:
    """RepositoryModelLoad reads the model folders given to serve() afresh."""

    def write_model(name: str) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text(
            json.dumps({"name": name, "implementation": "actorserve.models.identity.IdentityModel"})
        )

    write_model("echo")
    repository = ModelRepository((tmp_path,))
    settings = Settings(
        models=tuple(repository.discover()), host="127.0.0.1", http_port=None, grpc_port=0, grace_period=2.0
    )
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(actorserve.serve, settings, repository=repository))
        assert server.grpc_address is not None
        write_model("late")
        # auth is on by default: the management token serve() generated
        auth = {
            "authorization": "Bearer " + (await trio.Path(server.settings.token_file).read_text()).strip()
        }

        def scenario() -> tuple[list[str], str]:
            with grpcclient.InferenceServerClient("{}:{}".format(*server.grpc_address)) as c:
                c.load_model("late", headers=auth)
                names = [m["name"] for m in c.get_model_repository_index(as_json=True)["models"]]
                with pytest.raises(InferenceServerException) as info:
                    c.load_model("nope", headers=auth)
                return names, status_of(info.value)

        assert await in_thread(scenario) == (["echo", "late"], "StatusCode.NOT_FOUND")
        server.shutdown()


async def test_shutdown_drains_in_flight_calls_and_refuses_new_ones() -> None:
    async with running_grpc_server() as server:
        model = server.model("gate")
        results: queue.Queue[Any] = queue.Queue()
        c = client(server)
        c.async_infer(
            "gate",
            [],
            lambda result, error: results.put((result, error)),
            request_id="inflight",
            parameters={"gate": "g"},
            client_timeout=TIMEOUT,
        )
        with trio.fail_after(TIMEOUT):
            await model.started["inflight"].wait()
        server.scope.cancel()  # serve_grpc starts draining...
        await trio.testing.wait_all_tasks_blocked()  # ...and waits for the call in flight
        assert not server.stopped.is_set()

        def refused() -> tuple[str, str]:
            with pytest.raises(InferenceServerException) as info:
                c.infer("identity", [tensor("INPUT0", np.zeros(1, np.int8))])
            return status_of(info.value), info.value.message()

        assert await in_thread(refused) == ("StatusCode.UNAVAILABLE", "the server is shutting down")
        model.gates["g"].set()
        result, error = await in_thread(lambda: results.get(timeout=TIMEOUT))
        assert error is None
        assert result.get_response().id == "inflight"
        c.close()


async def test_shutdown_cancels_calls_still_running_after_the_grace_period() -> None:
    async with running_grpc_server(grace_period=0.2) as server:
        model = server.model("gate")
        results: queue.Queue[Any] = queue.Queue()
        c = client(server)
        c.async_infer(
            "gate",
            [],
            lambda result, error: results.put((result, error)),
            request_id="stuck",
            parameters={"gate": "never"},
            client_timeout=TIMEOUT,
        )
        with trio.fail_after(TIMEOUT):
            await model.started["stuck"].wait()
        server.scope.cancel()
        with trio.fail_after(TIMEOUT):
            await model.left["stuck"].wait()
        assert model.outcome["stuck"] == "cancelled"
        result, error = await in_thread(lambda: results.get(timeout=TIMEOUT))
        assert result is None
        assert status_of(error) in ("StatusCode.CANCELLED", "StatusCode.UNAVAILABLE")
        await server.assert_quiet()
        c.close()


async def test_shutdown_lets_a_stream_finish_its_requests_then_ends_it() -> None:
    async with running_grpc_server() as server:
        model = server.model("gate")
        stream = StreamClient(server)
        stream.client.async_stream_infer(
            "gate", [], request_id="inflight", parameters={"gate": "g", "n_tokens": 2}
        )
        with trio.fail_after(TIMEOUT):
            await model.started["inflight"].wait()
        server.scope.cancel()  # serve_grpc drains: the stream stops reading...
        await trio.testing.wait_all_tasks_blocked()
        model.gates["g"].set()  # ...its request in flight finishes...

        def scenario() -> list[Any]:
            got: list[Any] = []
            for _ in range(3):
                result, error = stream.next()
                got.append(
                    int(result.as_numpy("index")[0]) if error is None else (status_of(error), error.message())
                )
            stream.close()
            return got

        # ...and then the call ends with UNAVAILABLE.
        assert await in_thread(scenario) == [0, 1, ("StatusCode.UNAVAILABLE", "the server is shutting down")]
        with trio.fail_after(TIMEOUT):
            await server.stopped.wait()
