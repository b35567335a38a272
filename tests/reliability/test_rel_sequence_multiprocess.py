"""Sequence races through ``python -m actorserve --api-workers 2`` (issue 14): an engine
process and two fronts, each request on a new connection (the kernel picks the front).

The model (``benchmarks/reliability/sequence_models/seqcount``) counts its own hooks
and reports them on request, since the test cannot see into the engine process. Idle
expiry vs a new request, eviction, cancel vs end sent at once (from two fronts), and an
unload during SSE streams; then every hook ran once, no sequence is open and the
metrics agree.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.scrape import parse, value
from support.servers import ServerProcess, start_server

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "benchmarks" / "reliability" / "sequence_models" / "seqcount"
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("seqrepo")
    shutil.copytree(MODEL, repo / "seqcount")
    settings = json.loads((repo / "seqcount" / "model-settings.json").read_text())
    settings["sequence"] = {"idle_timeout_ms": 1000, "max_sequences": 4, "evict_idle": True, "max_queue": 4}
    (repo / "seqcount" / "model-settings.json").write_text(json.dumps(settings))
    server: ServerProcess = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--api-workers",
        "2",
        "--no-auth",
        "--grace-period",
        "0.3",
        str(repo),
    )
    try:
        server.wait_for(r"serving with 2 front process", 60)
        yield server.wait_for(r"processes: REST listening on (http://\S+)")[1]
    finally:
        server.stop()


def post(url: str, rid: str, n_tokens: int = 1, **parameters: Any) -> httpx.Response:
    body = {"id": rid, "inputs": [], "parameters": {"n_tokens": n_tokens, **parameters}}
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:  # a new connection: any front
        return client.post("/v2/models/seqcount/infer", json=body)


def hooks(url: str) -> list[int]:
    """[states, ended, doubles, cancelled, open, slots held] as the model counts them."""
    reply = post(url, "report", report=True)
    assert reply.status_code == 200, reply.text
    data: list[int] = reply.json()["outputs"][0]["data"]
    return data


def stream(url: str, rid: str, n_tokens: int, **parameters: Any) -> list[str]:
    """An SSE stream: ``data:<total>`` per response, ``error:<message>`` at an error."""
    body = {"id": rid, "inputs": [], "parameters": {"n_tokens": n_tokens, **parameters}}
    events: list[str] = []
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        with client.stream("POST", "/v2/models/seqcount/infer_stream", json=body) as reply:
            if reply.status_code != 200:
                reply.read()
                return [f"status {reply.status_code}: {reply.json()['error']}"]
            kind = "data"
            for line in reply.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    doc = json.loads(line[6:])
                    events.append(
                        f"error:{doc['error']}" if kind == "error" else f"data:{doc['outputs'][0]['data'][0]}"
                    )
                    kind = "data"
    return events


def end_into(answers: dict[str, Any], url: str, rid: str, sid: str) -> None:
    answers["end"] = stream(url, rid, 3, sequence_id=sid, sequence_end=True)


def test_expiry_eviction_and_cancel_vs_end(cluster: str) -> None:
    url = cluster
    before = hooks(url)
    # idle expiry vs a new request, and a restart of the expired id
    assert post(url, "e1", sequence_id="e", sequence_start=True).status_code == 200
    time.sleep(1.3)  # idle_timeout_ms=1000 (room for a slow, shared machine below)
    late = post(url, "e2", sequence_id="e")
    assert (late.status_code, late.json()) == (404, {"error": "sequence 'e' expired"})
    again = post(url, "e3", sequence_id="e", sequence_start=True, sequence_end=True)
    assert again.status_code == 200 and again.json()["outputs"][0]["data"] == [1]
    # eviction: the fifth start evicts the least recently used of four
    for sid in ("v1", "v2", "v3", "v4", "v5"):
        assert post(url, sid, sequence_id=sid, sequence_start=True).status_code == 200
    gone = post(url, "v1b", sequence_id="v1")
    assert (gone.status_code, gone.json()) == (
        404,
        {"error": "sequence 'v1' was evicted (max_sequences reached)"},
    )
    for sid in ("v2", "v3", "v4", "v5"):
        reply = post(url, f"{sid}-end", 0, sequence_id=sid, sequence_end=True)
        assert reply.status_code == 200, reply.text
    # cancel vs end, sent at once from two connections (maybe two fronts)
    outcomes = []
    for n in range(8):
        sid = f"ce{n}"
        assert post(url, f"o{n}", 0, sequence_id=sid, sequence_start=True).status_code == 200
        answers: dict[str, Any] = {}
        end = threading.Thread(target=end_into, args=(answers, url, f"end{n}", sid))
        end.start()
        cancel = post(url, f"c{n}", 0, sequence_id=sid, sequence_cancel=True)
        end.join(TIMEOUT)
        if cancel.status_code == 200:
            assert cancel.json()["parameters"] == {"sequence_id": sid, "sequence_cancelled": True}
            assert answers["end"][-1] in (
                f"error:sequence {sid!r} was cancelled",
                f"status 404: sequence {sid!r} was cancelled",
            )
            outcomes.append("cancelled")
        else:
            assert (cancel.status_code, cancel.json()) == (404, {"error": f"sequence {sid!r} has ended"})
            assert answers["end"] == ["data:1", "data:2", "data:3"], answers
            outcomes.append("ended")
    states, ended, doubles, _, open_now, held = (a - b for a, b in zip(hooks(url), before, strict=True))
    assert (doubles, open_now, held) == (0, 0, 0)
    assert states == ended == 2 + 5 + 8
    samples = parse(httpx.get(f"{url}/metrics").text)
    assert value(samples, "actorserve_sequences_open", model="seqcount", version="1") == 0
    for reason, count in {"expired": 1, "evicted": 1, "cancelled": outcomes.count("cancelled")}.items():
        assert (
            value(samples, "actorserve_sequences_ended_total", model="seqcount", version="1", reason=reason)
            == count
        )


def test_unload_during_sse_streams_and_load_again(cluster: str) -> None:
    url = cluster
    results: dict[str, list[str]] = {}
    threads = [
        threading.Thread(
            target=lambda sid=sid: results.__setitem__(
                sid, stream(url, sid, 1_000_000, sequence_id=sid, sequence_start=True)
            )
        )
        for sid in ("u1", "u2")
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + TIMEOUT
    while hooks(url)[4] < 2 and time.monotonic() < deadline:  # both sequences are open
        time.sleep(0.02)
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        assert client.post("/v2/repository/models/seqcount/unload", json={}).status_code == 200
        for thread in threads:
            thread.join(TIMEOUT)
        for sid in ("u1", "u2"):
            assert results[sid][-1] == f"error:sequence {sid!r} was shut down", results[sid][-2:]
        after = post(url, "x", sequence_id="u1")
        assert after.status_code in (404, 503), after.text
        assert client.post("/v2/repository/models/seqcount/load", json={}).status_code == 200
    assert post(url, "new", 2, sequence_id="u1", sequence_start=True, sequence_end=True).json()["outputs"][0][
        "data"
    ] == [1, 2]
    assert hooks(url)[2] == 0  # the new model instance: no hook ran twice
    samples = parse(httpx.get(f"{url}/metrics").text)
    assert value(samples, "actorserve_sequences_open", model="seqcount", version="1") == 0
