"""``tritonclient.http`` against the REST transport, on both front doors: every datatype
and two shapes, as JSON and as binary tensors (its default), plus its other calls.

tritonclient.http is synchronous (gevent-based): each scenario runs in a worker thread
with its own client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
import trio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import actorserve
from actorserve.server.composition import Server

pytestmark = pytest.mark.parametrize("server", ["fast", "quart"], indirect=True)

T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


def connect(server: Server) -> httpclient.InferenceServerClient:
    assert server.http_address is not None
    host, port = server.http_address
    return httpclient.InferenceServerClient(f"{host}:{port}", connection_timeout=30, network_timeout=30)


def sample(datatype: str, shape: tuple[int, ...], binary: bool) -> np.ndarray:
    """Values that exercise each datatype's range (extremes included; BYTES that are not
    UTF-8 only as binary: JSON cannot carry them)."""
    count = int(np.prod(shape))
    if datatype == "BYTES":
        odd = b"\x00\xff" if binary else "\u2603".encode()
        values = [b"", b"a", "é".encode(), odd, b"x" * 40, b"z"][:count]
        out = np.empty(count, dtype=object)
        out[:] = values
        return out.reshape(shape)
    if datatype == "BOOL":
        return np.array([True, False, True, True, False, False][:count]).reshape(shape)
    dtype = np.dtype(
        {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype, datatype.lower())
    )
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [0.5, -1.25, float(info.max), float(info.min), float(info.tiny), 3.0][:count]
    else:
        iinfo = np.iinfo(dtype)
        values = [int(iinfo.max), int(iinfo.min), 1, 0, int(iinfo.max) - 1, 7][:count]
    return np.array(values, dtype=dtype).reshape(shape)


DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", DATATYPES)
async def test_identity_round_trip(server: Server, datatype: str, binary: bool) -> None:
    def scenario() -> list[tuple[np.ndarray, np.ndarray, dict[str, Any]]]:
        results = []
        with connect(server) as client:
            for shape in ((1,), (2, 3)):
                data = sample(datatype, shape, binary)
                tensor = httpclient.InferInput("INPUT0", list(shape), datatype)
                tensor.set_data_from_numpy(data, binary_data=binary)
                outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
                result = client.infer(
                    "identity", [tensor], outputs=outputs, request_id=f"{datatype}-{binary}"
                )
                results.append((data, result.as_numpy("OUTPUT0"), result.get_response()))
        return results

    for sent, got, response in await in_thread(scenario):
        assert got is not None
        assert got.shape == sent.shape
        if datatype == "BYTES":  # tritonclient gives str for JSON BYTES, bytes for binary
            expected = sent if binary else np.vectorize(bytes.decode, otypes=[object])(sent)
            assert got.tolist() == expected.tolist()
        else:
            assert got.dtype == sent.dtype
            assert np.array_equal(got, sent)
        assert response["id"] == f"{datatype}-{binary}"
        assert response["outputs"][0]["datatype"] == datatype
        assert ("binary_data_size" in response["outputs"][0].get("parameters", {})) == binary


async def test_default_binary_outputs_without_requested_outputs(server: Server) -> None:
    """No outputs requested: tritonclient sends binary_data_output=true."""

    def scenario() -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        with connect(server) as client:
            a = httpclient.InferInput("INPUT0", [2, 2], "FP32")
            a.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32))
            b = httpclient.InferInput("INPUT1", [2], "BYTES")
            b.set_data_from_numpy(np.array([b"p", b"q"], dtype=object))
            result = client.infer("identity", [a, b], parameters={"note": "kept"})
            return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), result.get_response()

    out0, out1, response = await in_thread(scenario)
    assert out0.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert out1.tolist() == [b"p", b"q"]
    assert response["parameters"] == {"note": "kept"}


async def test_gzip_response_compression(server: Server) -> None:
    def scenario() -> np.ndarray:
        with connect(server) as client:
            data = np.arange(3000, dtype=np.int64)
            tensor = httpclient.InferInput("INPUT0", [3000], "INT64")
            tensor.set_data_from_numpy(data)
            result = client.infer(
                "identity",
                [tensor],
                request_compression_algorithm="gzip",
                response_compression_algorithm="gzip",
            )
            return result.as_numpy("OUTPUT0")

    assert (await in_thread(scenario)).tolist() == list(range(3000))


async def test_server_and_model_calls(server: Server) -> None:
    def scenario() -> dict[str, Any]:
        with connect(server) as client:
            return {
                "live": client.is_server_live(),
                "ready": client.is_server_ready(),
                "model_ready": client.is_model_ready("identity"),
                "unknown_ready": client.is_model_ready("nope"),
                "server": client.get_server_metadata(),
                "model": client.get_model_metadata("streamer"),
                "index": client.get_model_repository_index(),
            }

    got = await in_thread(scenario)
    assert (got["live"], got["ready"], got["model_ready"], got["unknown_ready"]) == (True, True, True, False)
    assert got["server"]["name"] == "actorserve"
    assert got["server"]["version"] == actorserve.__version__
    assert got["model"]["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]
    assert {m["name"] for m in got["index"]} >= {"identity", "streamer", "accumulator"}


async def test_load_unload_and_errors(server: Server) -> None:
    def scenario() -> tuple[bool, bool, str, str]:
        with connect(server) as client:
            client.unload_model("streamer")
            after_unload = client.is_model_ready("streamer")
            client.load_model("streamer")
            after_load = client.is_model_ready("streamer")
            with pytest.raises(InferenceServerException) as missing:
                client.load_model("nope")
            tensor = httpclient.InferInput("INPUT0", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
            with pytest.raises(InferenceServerException) as bad:
                client.infer("identity", [tensor], outputs=[httpclient.InferRequestedOutput("NOPE")])
            return (
                after_unload,
                after_load,
                f"{missing.value.status()} {missing.value.message()}",
                (f"{bad.value.status()} {bad.value.message()}"),
            )

    after_unload, after_load, missing, bad = await in_thread(scenario)
    assert (after_unload, after_load) == (False, True)
    assert missing == "404 model 'nope' is not in the model repository"
    assert bad == "400 unknown requested output 'NOPE' (model 'identity' has OUTPUT0, OUTPUT1)"


async def test_sequences_with_tritonclient(server: Server) -> None:
    def scenario() -> list[int]:
        totals = []
        with connect(server) as client:
            for i, value in enumerate([5, 6, 7]):
                tensor = httpclient.InferInput("INPUT", [1], "INT64")
                tensor.set_data_from_numpy(np.array([value], dtype=np.int64))
                result = client.infer(
                    "accumulator", [tensor], sequence_id=4242, sequence_start=i == 0, sequence_end=i == 2
                )
                totals.append(int(result.as_numpy("OUTPUT")[0]))
        return totals

    assert await in_thread(scenario) == [5, 11, 18]
