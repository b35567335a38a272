"""``python -m actorserve --api-workers 2``: a parent, one engine process and two fronts.

Real processes on 127.0.0.1 port 0: sequences served by whichever front accepts the
connection, a front killed mid-stream (only its own connections fail; it is restarted),
the engine killed (the server exits 1 with a clear line), SIGTERM (exit 0). Every example
also runs against this shape: see tests/test_examples.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest
from support.rel_process import established_connections
from support.servers import ServerProcess, start_server

STARTUP_TIMEOUT = 60.0

MODELS = {
    "streamer": {"implementation": "actorserve.models.streamer.StreamerModel"},
    "accumulator": {
        "implementation": "actorserve.models.accumulator.AccumulatorModel",
        "sequence": {"idle_timeout_ms": 600000},
    },
}


@attrs.define(eq=False)
class Cluster(ServerProcess):
    """The parent's process, its log, and the REST URL it reports."""

    http_url: str = ""

    def front_pids(self) -> dict[int, int]:
        """front index -> pid of its current process."""
        pids: dict[int, int] = {}
        for match in re.finditer(r"front (\d+) process started \(pid (\d+)\)", self.text()):
            pids[int(match[1])] = int(match[2])
        return pids

    def engine_pid(self) -> int:
        return int(self.wait_for(r"engine process started \(pid (\d+)\)")[1])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    for name, settings in MODELS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    server = start_server("--http-port", "0", "--grpc-port", "off", "--api-workers", "2", str(tmp_path))
    running = Cluster(server.process, server.log, server.lock, server.reader)
    try:
        running.wait_for(r"serving with 2 front process", STARTUP_TIMEOUT)
        running.http_url = running.wait_for(r"processes: REST listening on (http://\S+)")[1]
        yield running
    finally:
        running.stop()


def accumulate(client: httpx.Client, value: int, **sequence: object) -> httpx.Response:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT64", "data": [value]}],
        "parameters": sequence,
    }
    return client.post("/v2/models/accumulator/infer", json=body)


def test_sequences_are_served_by_any_front(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
        reply = accumulate(client, 1, sequence_start=True)
        assert reply.status_code == 200, reply.text
        sequence_id = reply.headers["sequence-id"]
    total = 1
    for value in range(2, 22):  # a new connection each time: the kernel picks the front
        with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
            reply = accumulate(client, value, sequence_id=sequence_id, sequence_end=value == 21)
        total += value
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [total]
    with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
        gone = accumulate(client, 1, sequence_id=sequence_id)
    assert gone.status_code == 404 and "has ended" in gone.json()["error"]


def test_fronts_show_declared_parameters_and_the_token_file_is_logged_once(cluster: Cluster) -> None:
    """Model metadata crosses the process boundary whole (the playground reads its
    parameters); the parent generates the token and logs its file once for every process."""
    with httpx.Client(base_url=cluster.http_url, timeout=10) as client:
        streamer = client.get("/v2/models/streamer").json()
        accumulator = client.get("/v2/models/accumulator").json()
    assert streamer["parameters"]["request_parameters"] == "delay,n_tokens,usage"
    assert streamer["parameters"]["text_generation.max_tokens"] == "n_tokens"
    assert accumulator["parameters"] == {"request_parameters": ""}
    assert len(re.findall(r"management token generated: .* token in \S+", cluster.text())) == 1


def _stream_tokens(url: str, n_tokens: int, delay: float) -> list[str]:
    body = {"text_input": "x", "parameters": {"n_tokens": n_tokens, "delay": delay}}
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream("POST", "/v2/models/streamer/generate_stream", json=body) as response,
    ):
        return [line for line in response.iter_lines() if line.startswith("data:")]


def test_a_killed_front_loses_only_its_connections_and_is_restarted(cluster: Cluster) -> None:
    before = cluster.front_pids()
    assert sorted(before) == [1, 2]
    victim = before[1]
    os.kill(victim, signal.SIGKILL)
    cluster.wait_for(rf"front 1 \(pid {victim}\) exited with code -9: restarting it")
    cluster.wait_for(rf"front 1 process started \(pid (?!{victim}\b)\d+\)")
    after = cluster.front_pids()
    assert after[1] != victim and after[2] == before[2]
    # every new connection is served again, whichever front takes it
    for _ in range(6):
        assert _stream_tokens(cluster.http_url, 3, 0.0) == [
            f'data: {{"model_name":"streamer","model_version":"1","text_output":"x:{k}","index":{k}}}'
            for k in range(3)
        ]


def test_a_stream_on_a_killed_front_is_cut_while_the_other_front_serves(cluster: Cluster) -> None:
    """Six streams on new connections land on either front (the kernel picks); killing
    the front that holds the most of them cuts exactly those, and the others finish with
    every token."""
    outcomes: list[dict[str, object]] = [{} for _ in range(6)]

    def run(box: dict[str, object]) -> None:
        try:
            box["tokens"] = _stream_tokens(cluster.http_url, 300, 0.01)
        except httpx.HTTPError as exc:
            box["error"] = exc

    runners = [threading.Thread(target=run, args=(box,)) for box in outcomes]
    for runner in runners:
        runner.start()
    port = int(cluster.http_url.rsplit(":", 1)[1])
    fronts = cluster.front_pids()
    deadline = time.monotonic() + 10
    while True:  # the streams are running (each takes ~3 s)
        held = {index: established_connections(pid, port) for index, pid in fronts.items()}
        if sum(held.values()) == 6 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sum(held.values()) == 6, held
    victim = max(held, key=lambda index: held[index])
    os.kill(fronts[victim], signal.SIGKILL)
    for runner in runners:
        runner.join(timeout=30)
    complete = [o for o in outcomes if len(o.get("tokens", [])) == 300]  # type: ignore[arg-type]
    assert len(outcomes) - len(complete) == held[victim], (held, outcomes)
    assert cluster.process.poll() is None


def test_the_engine_dying_stops_the_server_with_exit_code_1(cluster: Cluster) -> None:
    os.kill(cluster.engine_pid(), signal.SIGKILL)
    assert cluster.process.wait(timeout=30) == 1
    cluster.wait_for(r"the engine process \(pid \d+\) exited with code -9: stopping the server")


def test_sigterm_stops_every_process_cleanly(cluster: Cluster) -> None:
    fronts = cluster.front_pids()
    engine = cluster.engine_pid()
    cluster.process.send_signal(signal.SIGTERM)
    assert cluster.process.wait(timeout=30) == 0
    for pid in [*fronts.values(), engine]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_children_stop_when_the_parent_is_killed(cluster: Cluster) -> None:
    """A parent killed with SIGKILL cannot stop its children; each notices the end of
    the pipe the parent held (its stdin) and stops by itself."""
    children = [*cluster.front_pids().values(), cluster.engine_pid()]
    assert len(children) == 3 and all(_running(pid) for pid in children)
    cluster.process.kill()
    cluster.process.wait(timeout=10)
    deadline = time.monotonic() + 20
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _running(pid)]
        time.sleep(0.05)
    assert alive == [], f"still running after the parent died: {alive}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat  # a zombie has exited (its parent is gone, init reaps it)
