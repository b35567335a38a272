"""Issue 30, the cost bound: a request of S bytes (after decompression) costs each of
the server's processes at most ``COST_MULTIPLE`` times S of memory, whatever it holds,
on every input kind's worst case sent at the body limit: short strings, numeric zeros,
parameter keys, nested parameters, a gzip bomb, prompts; over REST and gRPC, in both
process shapes (``--api-workers 0`` and a front beside the engine).

Memory only: the time per MiB and the stall of a health probe are measured by
``benchmarks/security_cost.py`` (docs/security.md#cost-bound), as timed asserts fail on
a loaded machine. Each process's resident memory is sampled every 10 ms while the
request is handled; its peak growth is compared with the bound (plus ``SLACK`` for what
any request may touch the first time: a worker thread's stack, an allocator arena).
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest
from support.servers import Served, identity_folder, serving

from actorserve.limits import MAX_BYTES_ELEMENTS, MAX_PARAMETER_DEPTH
from actorserve.proto import inference as pb

#: the body limit the servers run with: the worst cases are sent at it
BODY_LIMIT = 8 * 1024 * 1024
#: a request of S bytes costs a process at most this times S (docs/security.md#cost-bound):
#: BYTES stay packed (one buffer with offsets) from the wire through the front and the
#: engine link, JSON numbers are converted a slice at a time; the most measured is a
#: front echoing numbers, about 15 times S with the slack below (10 for short strings)
COST_MULTIPLE = 16
#: what any request may cost a process once, whatever its size
SLACK = 24 * 1024 * 1024
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model folder of both shapes (built once: the servers only read it)."""
    folder = identity_folder(tmp_path_factory.mktemp("models"))
    if _has_transformers():
        from support.tiny_llm import build

        build(folder / "llm", "gpt2", dtype="float32")
    return folder


@pytest.fixture(scope="module", params=[0, 1], ids=["api-workers-0", "api-workers-1"])
def served(request: pytest.FixtureRequest, models: Path) -> Iterator[Served]:
    with serving(models, request.param, "--max-body-bytes", str(BODY_LIMIT), ready_within=90) as served:
        # one request of each kind first: one-time costs (the first connection, the gRPC
        # client, a worker thread, the first parse in a thread) are no part of a request's
        assert httpx.post(f"{served.http}/v2/models/identity/infer", json={"inputs": []}).status_code == 400
        _post(served, _strings(100_000))
        yield served


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


class Peaks:
    """The peak resident memory of each process of the server, above what it had when
    this started, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        root = psutil.Process(pid)
        self.processes = [root, *root.children(recursive=True)]
        self.before = {p.pid: p.memory_info().rss for p in self.processes}
        self.growth = dict.fromkeys(self.before, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            for process in self.processes:
                try:
                    rss = process.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                self.growth[process.pid] = max(self.growth[process.pid], rss - self.before[process.pid])
            if self._stop.wait(0.01):
                return

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(served: Served, size: int, send: Callable[[], Any]) -> Any:
    """``send()`` while each process's memory is sampled; assert the bound for ``size``."""
    with Peaks(served.process.process.pid) as peaks:
        result = send()
    bound = COST_MULTIPLE * size + SLACK
    assert max(peaks.growth.values()) <= bound, {
        pid: f"{g / size:.1f} x S" for pid, g in peaks.growth.items()
    }
    return result


# -- the worst case of each input kind, at the body limit ----------------------------------


def _oip(inputs: list[dict[str, Any]], **rest: Any) -> bytes:
    return json.dumps({"inputs": inputs, **rest}, separators=(",", ":")).encode()


def _strings(count: int, value: str = "ab") -> bytes:
    """A BYTES tensor of ``count`` short strings: the most Python objects per byte."""
    data = (f'"{value}",' * count)[:-1]
    head = f'{{"inputs":[{{"name":"INPUT0","shape":[{count}],"datatype":"BYTES","data":['
    return (head + data + "]}]}").encode()


def _zeros(count: int) -> bytes:
    data = ",".join(["0"] * count)
    return f'{{"inputs":[{{"name":"INPUT0","shape":[{count}],"datatype":"INT64","data":[{data}]}}]}}'.encode()


def _post(
    served: Served, body: bytes, path: str = "/v2/models/identity/infer", **headers: str
) -> httpx.Response:
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(f"{served.http}{path}", content=body, headers=headers, timeout=120)


def test_short_strings_at_the_count_limit(served: Served) -> None:
    body = _strings(MAX_BYTES_ELEMENTS)  # answered: each string echoed back
    reply = measure(served, len(body), lambda: _post(served, body))
    assert reply.status_code == 200, reply.text[:200]
    assert len(reply.json()["outputs"][0]["data"]) == MAX_BYTES_ELEMENTS


def test_short_strings_past_the_count_limit_in_gzip(served: Served) -> None:
    raw = _strings((BODY_LIMIT - 100) // 4, "a")  # 2 M strings of 4 bytes
    body = gzip.compress(raw)
    reply = measure(served, len(raw), lambda: _post(served, body, **{"Content-Encoding": "gzip"}))
    assert reply.status_code == 400, reply.text[:200]
    assert "MAX_JSON_STRINGS" in reply.json()["error"]


def test_numeric_zeros(served: Served) -> None:
    count = (BODY_LIMIT - 100) // 2
    body = _zeros(count)
    reply = measure(served, len(body), lambda: _post(served, body))
    assert reply.status_code == 200, reply.text[:200]
    assert reply.content.count(b",") >= count - 1


def test_parameter_keys(served: Served) -> None:
    count = (BODY_LIMIT - 100) // 13
    params = ",".join(f'"k{i:07d}":0' for i in range(count))
    body = f'{{"inputs":[],"parameters":{{{params}}}}}'.encode()
    reply = measure(served, len(body), lambda: _post(served, body))
    assert reply.status_code == 400, reply.text[:200]
    assert "MAX_JSON_KEYS" in reply.json()["error"]  # counted before parsing
    assert len(reply.content) < 8192  # the error names the limit, not the keys


def test_nested_parameters(served: Served) -> None:
    deep = "[" * (MAX_PARAMETER_DEPTH + 1) + "]" * (MAX_PARAMETER_DEPTH + 1)
    tensor = {"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}
    for parameters in (f'{{"p":{deep}}}', f'{{"p":{deep[1:-1]}}}'):
        body = _oip([tensor])[:-1] + b',"parameters":' + parameters.encode() + b"}"
        reply = measure(served, len(body), lambda body=body: _post(served, body))
        if parameters.count("[") > MAX_PARAMETER_DEPTH:
            assert reply.status_code == 400, reply.text[:200]
            assert "MAX_PARAMETER_DEPTH" in reply.json()["error"]
        else:  # as deep as allowed: echoed by identity, not a 500
            assert reply.status_code == 200, reply.text[:200]


@pytest.mark.parametrize("path", ["/v2/models/llm/generate", "/v1/completions"])
def test_a_prompt_at_the_body_limit(served: Served, path: str) -> None:
    if not _has_transformers():
        pytest.skip("needs the llm extra")
    prompt = "To be, or not to be " * ((BODY_LIMIT - 200) // 20)
    # Triton's generate reads every other key as an input: the model is named by the path
    if path.startswith("/v2"):
        fields: dict[str, object] = {"text_input": prompt, "parameters": {"max_tokens": 1}}
    else:
        fields = {"prompt": prompt, "model": "llm", "max_tokens": 1}
    body = json.dumps(fields).encode()
    reply = measure(served, len(body), lambda: _post(served, body, path))
    assert reply.status_code == 400, reply.text[:200]
    assert "max_prompt_chars" in reply.text


# -- gRPC ----------------------------------------------------------------------------------


def _grpc(served: Served, message: bytes) -> tuple[grpc.StatusCode, str]:
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(served.grpc, options=options) as channel:
        call = channel.unary_unary(INFER, request_serializer=bytes, response_deserializer=lambda b: b)
        try:
            call(message, timeout=120)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_grpc_raw_short_strings(served: Served) -> None:
    count = MAX_BYTES_ELEMENTS
    raw = b"\x02\x00\x00\x00ab" * count
    tensor = pb.ModelInferRequestInferInputTensor(name="INPUT0", datatype="BYTES", shape=[count])
    message = bytes(pb.ModelInferRequest(model_name="identity", inputs=[tensor], raw_input_contents=[raw]))
    code, details = measure(served, len(message), lambda: _grpc(served, message))
    assert code == grpc.StatusCode.OK, details


def test_grpc_parameters(served: Served) -> None:
    entry = _field(4, _field(1, b"k") + _field(2, _field(3, b"v")))  # "k": string_param "v"
    message = _field(1, b"identity") + entry * ((BODY_LIMIT - 100) // len(entry))
    code, details = measure(served, len(message), lambda: _grpc(served, message))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert "MAX_PARAMETERS" in details


def test_the_cost_bound_is_documented() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert "## Cost bound" in docs
    assert f"at most {COST_MULTIPLE} times S" in docs
