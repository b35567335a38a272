"""Issue 19, findings 3, 6 and 8: small requests that stood for huge allocations, long
parses or a 5xx, against a real ``python -m actorserve`` in both process shapes
(``--api-workers 0`` and one front beside the engine).

Each case must be answered with a 400 naming its limit, the server's process tree must
stay within a small RSS bound while it is handled, and a ``/v2/health/live`` probe
running alongside must keep being answered. The time bounds are not speed targets: they
are wide multiples of the machine's pace measured in the same test (``support.pace``,
about 10 ms of Python on an idle core: the answer within 200 paces, each probe within 25),
so a busy machine widens them while a stall of seconds (the issue's gRPC message held the
process for 22 s) still fails. The sizes are far below the issue's (a 119-byte request
took 7.9 GB) so that the same test, run against the code before the fix, fails on the
RSS or time bound instead of exhausting the machine.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import grpc
import httpx
import pytest
import trio
from support.pace import pace
from support.rel_load import RssSampler, tree_rss
from support.servers import Served, identity_folder, serving

from actorserve.proto import inference as pb

#: an attack must be answered within this many paces (support.pace: ~2 s on an idle machine)
ANSWER_PACES = 200
#: the whole server (every process) may grow by at most this much while it is handled
RSS_BOUND = 64 * 1024 * 1024
#: every health probe sent while the attack is handled answers within this many paces
#: (~0.25 s on an idle machine; the probes answer in ~2 ms there)
PROBE_PACES = 25
INFER = "/inference.GRPCInferenceService/ModelInfer"
PREDICTIONS = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"


@pytest.fixture(scope="module", params=[0, 1], ids=["api-workers-0", "api-workers-1"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(identity_folder(tmp_path_factory.mktemp("models")), request.param) as served:
        # the first call of each kind pays one-time costs (the gRPC client's start, the
        # first connection) that are no part of what the cases measure
        assert (
            _grpc_infer(served.grpc, pb.ModelInferRequest(model_name="identity"))[0]
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        assert httpx.post(f"{served.http}/v2/models/identity/infer", json={"inputs": []}).status_code == 400
        yield served


@attrs.define
class Watch:
    """What happened while one attack was handled."""

    #: the machine's pace just before the attack (support.pace), the unit of the bounds
    pace: float = 0.0
    seconds: float = 0.0
    rss_growth: int = 0
    probes: list[float] = attrs.field(factory=list)
    #: probes done when the attack was answered; two more are awaited (one held up by a
    #: stall may answer after the attack)
    answered: int | None = None
    settled: trio.Event = attrs.field(factory=trio.Event)


async def _probe(client: httpx.AsyncClient, watch: Watch) -> None:
    """A probe every 10 ms, each one's answer time recorded (a server stall longer than
    the pause catches a probe in flight; :func:`attack` waits for it to report)."""
    while True:  # ends when the attack is answered (cancelled), bounded by its fail_after
        started = trio.current_time()
        reply = await client.get("/v2/health/live")
        assert reply.status_code == 200
        watch.probes.append(trio.current_time() - started)
        if watch.answered is not None and len(watch.probes) >= watch.answered + 2:
            watch.settled.set()
        await trio.sleep(0.01)


async def attack(served: Served, send: Any) -> tuple[Any, Watch]:
    """Run ``await send()`` while probing health and sampling the server's RSS."""
    watch = Watch()
    pid = served.process.process.pid
    async with httpx.AsyncClient(base_url=served.http, timeout=10) as prober:
        assert (await prober.get("/v2/health/live")).status_code == 200  # the connection is warm
        watch.pace = pace()
        before = tree_rss(pid)
        with RssSampler(pid, interval=0.02) as sampler:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_probe, prober, watch)
                await trio.sleep(0.05)
                started = time.monotonic()
                with trio.fail_after(30):
                    result = await send()
                    watch.seconds = time.monotonic() - started
                    watch.answered = len(watch.probes)
                    await watch.settled.wait()
                nursery.cancel_scope.cancel()
        watch.rss_growth = max(sampler.peak, tree_rss(pid)) - before
    return result, watch


def check(watch: Watch) -> None:
    assert watch.rss_growth < RSS_BOUND, watch
    # the server kept answering while it handled the attack (each probe got its 200)...
    assert watch.probes and watch.answered is not None and len(watch.probes) >= watch.answered + 2, watch
    # ...and never stalled: bounds in the machine's pace, never a fixed number of seconds
    assert watch.seconds < ANSWER_PACES * watch.pace, watch
    assert max(watch.probes) < PROBE_PACES * watch.pace, watch


async def post(served: Served, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.http, timeout=30) as client:
        return await client.post(path, content=body, headers=headers)


def _oip(inputs: list[dict[str, Any]]) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


def _binary_bytes_request(count: int) -> tuple[bytes, dict[str, str]]:
    """Triton's binary extension: a BYTES input claiming ``count`` elements in 4 bytes."""
    head = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [count], "datatype": "BYTES", "parameters": {"binary_data_size": 4}}
            ]
        }
    ).encode()
    return head + b"\0\0\0\0", {"Inference-Header-Content-Length": str(len(head))}


def _nested(depth: int) -> str:
    return "[" * depth + '"a"' + "]" * depth


# -- REST --------------------------------------------------------------------------------

REST_CASES = {
    # finding 3: allocation before the length check (shape [1e9] took 7.9 GB)
    "bytes-shape-vs-binary-data": (*_binary_bytes_request(50_000_000), "needs 50000000 BYTES elements"),
    "bytes-shape-1e10": (*_binary_bytes_request(10**10), "needs 10000000000 BYTES elements"),
    # finding 8: ValueError / RecursionError were 500s
    "zero-times-huge-dimension": (
        _oip([{"name": "x", "shape": [0, 2**62], "datatype": "FP32", "data": []}]),
        {},
        "at most 2**48",
    ),
    "65-dimensions": (
        _oip([{"name": "x", "shape": [1] * 65, "datatype": "FP32", "data": [1.0]}]),
        {},
        "at most 64",
    ),
    "bytes-nested-1000-deep": (
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": '
        + _nested(1000).encode()
        + b"}]}",
        {},
        "nested more than 64 lists deep",
    ),
    # finding 6: amplification (the issue's: 60 KiB of gzip -> 21 M lists, 200,000 inputs)
    "gzip-of-empty-lists": (
        gzip.compress(
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": ['
            + b"[]," * 4_000_000
            + b"1]}]}"
        ),
        {"Content-Encoding": "gzip"},
        "MAX_JSON_CONTAINERS",
    ),
    "many-empty-inputs": (
        _oip([{"name": f"x{i}", "shape": [0], "datatype": "INT32", "data": []} for i in range(5000)]),
        {},
        "MAX_INPUTS",
    ),
}


@pytest.mark.parametrize("case", REST_CASES)
async def test_rest_amplification_is_refused_fast_and_small(served: Served, case: str) -> None:
    body, headers, words = REST_CASES[case]
    headers = {"Content-Type": "application/json", **headers}
    reply, watch = await attack(served, lambda: post(served, "/v2/models/identity/infer", body, headers))
    check(watch)
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]


async def test_an_openai_chat_with_too_many_messages_is_refused(served: Served) -> None:
    messages = [{"role": "user", "content": ""}] * 20_000
    body = json.dumps({"model": "identity", "messages": messages}).encode()
    headers = {"Content-Type": "application/json"}
    reply, watch = await attack(served, lambda: post(served, "/v1/chat/completions", body, headers))
    check(watch)
    assert reply.status_code == 400, reply.text
    assert "MAX_CHAT_MESSAGES" in reply.json()["error"]["message"]


@pytest.mark.parametrize("kind", ["urlencoded", "multipart"])
async def test_a_torchserve_form_with_too_many_fields_is_refused(served: Served, kind: str) -> None:
    if kind == "urlencoded":
        body = b"&".join(b"f%d=" % i for i in range(100_000))
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
    else:
        part = b'--b\r\nContent-Disposition: form-data; name="f"\r\n\r\n\r\n'
        body = part * 50_000 + b"--b--\r\n"
        headers = {"Content-Type": "multipart/form-data; boundary=b"}
    reply, watch = await attack(served, lambda: post(served, "/predictions/identity", body, headers))
    check(watch)
    assert reply.status_code == 400, reply.text
    assert "MAX_FORM_FIELDS" in reply.text


# -- gRPC --------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _empty_bytes_contents(count: int) -> bytes:
    """A ModelInferRequest of one BYTES input with ``count`` empty ``bytes_contents``,
    written by hand (betterproto2 takes seconds to write millions of them)."""
    contents = b"\x42\x00" * count
    tensor = _field(1, b"x") + _field(2, b"BYTES") + _field(3, _varint(count)) + _field(5, contents)
    return _field(1, b"identity") + _field(5, tensor)


def _grpc_infer(
    address: str, message: pb.ModelInferRequest | bytes, method: str = INFER
) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(
        address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    ) as channel:
        call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=lambda b: b)
        try:
            call(message, timeout=30)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


GRPC_CASES = {
    "raw-bytes-shape-vs-data": (
        pb.ModelInferRequest(
            model_name="identity",
            inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="BYTES", shape=[50_000_000])],
            raw_input_contents=[b"\0\0\0\0"],
        ),
        "needs 50000000 BYTES elements",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "zero-times-huge-dimension": (
        pb.ModelInferRequest(
            model_name="identity",
            inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="FP32", shape=[0, 2**62])],
            raw_input_contents=[b""],
        ),
        "at most 2**48",
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "many-empty-inputs": (
        pb.ModelInferRequest(
            model_name="identity",
            inputs=[
                pb.ModelInferRequestInferInputTensor(name=f"x{i}", datatype="INT32", shape=[0])
                for i in range(5000)
            ],
        ),
        "MAX_INPUTS",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    # the same in raw contents: the shape proto/upb.py decodes, still counted on the wire first
    "many-empty-raw-inputs": (
        pb.ModelInferRequest(
            model_name="identity",
            inputs=[
                pb.ModelInferRequestInferInputTensor(name=f"x{i}", datatype="INT32", shape=[0])
                for i in range(5000)
            ],
            raw_input_contents=[b""] * 5000,
        ),
        "MAX_INPUTS",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    # finding 6: the 15 MiB message of 8 M took 22 s (the REST side of the process waited)
    "many-empty-bytes-contents": (
        _empty_bytes_contents(2_000_000),
        "MAX_BYTES_ELEMENTS",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
}


@pytest.mark.parametrize("case", GRPC_CASES)
async def test_grpc_amplification_is_refused_fast_and_small(served: Served, case: str) -> None:
    message, words, status = GRPC_CASES[case]
    (code, details), watch = await attack(
        served, lambda: trio.to_thread.run_sync(_grpc_infer, served.grpc, message)
    )
    check(watch)
    assert code == status, details
    assert words in details


async def test_a_torchserve_grpc_prediction_with_too_many_fields_is_refused(served: Served) -> None:
    entry = _field(3, _field(1, b"f") + _field(2, b""))  # one map entry: key "f", no value
    message = _field(1, b"identity") + entry * 100_000
    call = partial(_grpc_infer, served.grpc, message, PREDICTIONS)
    (code, details), watch = await attack(served, lambda: trio.to_thread.run_sync(call))
    check(watch)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "MAX_FORM_FIELDS" in details


async def test_a_generate_request_with_too_many_inputs_is_refused(served: Served) -> None:
    body = json.dumps({f"x{i}": "" for i in range(5000)}).encode()
    headers = {"Content-Type": "application/json"}
    reply, watch = await attack(served, lambda: post(served, "/v2/models/identity/generate", body, headers))
    check(watch)
    assert reply.status_code == 400, reply.text
    assert "MAX_INPUTS" in reply.json()["error"]


def test_the_limits_are_documented() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    names = (
        "MAX_JSON_CONTAINERS",
        "MAX_INPUTS",
        "MAX_FORM_FIELDS",
        "MAX_CHAT_MESSAGES",
        "MAX_BYTES_ELEMENTS",
    )
    for name in (*names, "max_archive_bytes", "max_archive_members", "max_response_bytes"):
        assert name in docs
