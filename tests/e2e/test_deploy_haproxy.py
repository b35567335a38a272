"""The proof of docs/deploy.md: three replicas behind a real HAProxy configured by
deploy/haproxy/haproxy.cfg, on loopback. Thirty sequences, interleaved, over REST,
SSE and gRPC ModelStreamInfer: each is answered by one replica and its running sums
are exact. Then one replica is killed with SIGKILL: its sequences get the distinct
``sequence_not_held`` error from a survivor (never a fresh sum), the others go on,
and new sequences land on the survivors. One survivor runs the multi-process shape
(two fronts and the engine, as deploy/ runs it), so the error crosses the engine link
too. Last, that one is drained with SIGTERM: its open sequences finish on it, new
starts go to the last one, and it stops as soon as its last sequence has ended.

HAProxy is Debian's package (``.ci/run`` installs it); its listening ports are picked
free just before it starts (HAProxy cannot report a port-0 bind)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from support.programs import require_program
from support.replicas import not_held_message, routing_hint
from support.servers import ServerProcess, start_server

from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
INFER = "/v2/models/accumulator/infer"
STARTUP = 90.0
#: sequences per transport
PER = 10
#: what the draining replica says to a start
DRAINING = "503 None replica 'r1' is draining: start the sequence on another replica"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def haproxy() -> str:
    return require_program("haproxy", "the sticky-sequences proof runs deploy/haproxy's configuration")


def start_replicas(
    starts: dict[str, tuple[str, ...]], servers: list[ServerProcess]
) -> dict[str, tuple[ServerProcess, str, str]]:
    """Start every replica (name: its arguments) at once, so that they load their models
    side by side, then wait for each to listen: name -> (server, REST host:port, gRPC
    host:port). Each server started is appended to ``servers``: the caller stops them."""
    for name, args in starts.items():
        servers.append(
            start_server("--http-port", "0", "--grpc-port", "0", "--replica-id", name, "--no-auth", *args)
        )
    replicas = {}
    for name, server in zip(starts, servers[-len(starts) :], strict=True):
        rest = server.wait_for(r"REST listening on http://(\S+?)[\s/]", STARTUP)[1]
        grpc_port = server.wait_for(r"gRPC listening on 127\.0\.0\.1:(\d+)", STARTUP)[1]
        replicas[name] = (server, rest, f"127.0.0.1:{grpc_port}")
    return replicas


def add(value: int) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]}


def pb_add(value: int, **parameters: Any) -> bytes:
    tensor = tensor_from_numpy("INPUT", np.array([value], dtype=np.int64))
    return bytes(
        request_to_pb(InferenceRequest(inputs=[tensor], parameters=parameters), model_name="accumulator")
    )


class Clients:
    """One REST client and one gRPC channel to the proxy; each call returns
    (total or None, replica, error text or None)."""

    def __init__(self, rest: str, grpc_target: str) -> None:
        self.http = httpx.Client(base_url=f"http://{rest}", timeout=30)
        self.channel = grpc.insecure_channel(grpc_target)
        self.stream = self.channel.stream_stream(
            STREAM, request_serializer=lambda b: b, response_deserializer=pb.ModelStreamInferResponse.parse
        )

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    def rest(self, value: int, headers: dict[str, str]) -> tuple[int | None, str, str | None, str | None]:
        reply = self.http.post(INFER, json=add(value), headers=headers)
        replica = reply.headers["actorserve-replica"]
        if reply.status_code != 200:
            body = reply.json()
            return None, replica, f"{reply.status_code} {body.get('reason')} {body['error']}", None
        return reply.json()["outputs"][0]["data"][0], replica, None, reply.headers.get("sequence-id")

    def sse(self, value: int, headers: dict[str, str]) -> tuple[int | None, str, str | None]:
        with self.http.stream("POST", INFER + "_stream", json=add(value), headers=headers) as reply:
            replica = reply.headers["actorserve-replica"]
            text = reply.read().decode()
        if reply.status_code != 200:
            body = json.loads(text)
            return None, replica, f"{reply.status_code} {body.get('reason')} {body['error']}"
        events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        return events[-1]["outputs"][0]["data"][0], replica, None

    def grpc(self, value: int, sid: str, **parameters: Any) -> tuple[int | None, str, str | None]:
        def requests() -> Iterator[bytes]:
            yield pb_add(value, **parameters)

        call = self.stream(requests(), metadata=[("sequence-id", sid)], timeout=30)
        (answer,) = list(call)
        replica = dict(call.initial_metadata())["actorserve-replica"]
        if answer.error_message:
            return None, replica, answer.error_message
        return int(response_from_pb(answer.infer_response).outputs[0].data[0]), replica, None


def test_thirty_sequences_through_haproxy_survive_a_killed_replica(tmp_path: Path) -> None:
    binary = haproxy()
    servers: list[ServerProcess] = []
    proxy: subprocess.Popen[bytes] | None = None
    try:
        # r1 drains on SIGTERM in the shape deploy/ runs (fronts and an engine process;
        # the one-process drain: tests/e2e/test_replicas.py); r2 and r3 are one process each
        starts = {"r1": ("--api-workers", "2", "--drain-timeout", "60")}
        replicas = start_replicas(
            {**starts, "r2": ("--api-workers", "0"), "r3": ("--api-workers", "0")}, servers
        )
        env = {
            **os.environ,
            "ACTORSERVE_PROXY_REST": f"127.0.0.1:{free_port()}",
            "ACTORSERVE_PROXY_GRPC": f"127.0.0.1:{free_port()}",
        }
        for name, (_, rest, grpc_address) in replicas.items():
            env[f"ACTORSERVE_{name.upper()}_REST"] = rest
            env[f"ACTORSERVE_{name.upper()}_GRPC"] = grpc_address
        checked = subprocess.run([binary, "-c", "-f", str(CONFIG)], env=env, capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr.decode()
        log = (tmp_path / "haproxy.log").open("wb")  # a file: a pipe nobody reads could fill
        proxy = subprocess.Popen([binary, "-db", "-f", str(CONFIG)], env=env, stdout=log, stderr=log)
        clients = Clients(env["ACTORSERVE_PROXY_REST"], env["ACTORSERVE_PROXY_GRPC"])
        try:
            _prove(clients, replicas)
        finally:
            clients.close()
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=10)
            log.close()
        for server in servers:
            server.stop()


def _wait_for_proxy(clients: Clients) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if clients.http.get("/v2/health/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    pytest.fail("HAProxy did not answer within 30 s")


def _start(call: Callable[[], tuple[int | None, str, str | None]]) -> tuple[int | None, str, str | None]:
    """A sequence start, retried as a client does after r1's 503 + Retry-After (until
    HAProxy's readiness check, every second, has taken r1 out; bounded)."""
    for _ in range(50):
        total, where, error = call()
        if not (where == "r1" and error == DRAINING):
            return total, where, error
        time.sleep(0.1)
    pytest.fail("HAProxy kept sending new sequences to the draining replica for 5 s")


def _step(
    clients: Clients, s: dict[str, Any], value: int, *, end: bool = False
) -> tuple[int | None, str, str | None]:
    """One request of sequence ``s`` over its transport (``end``: its last)."""
    headers = {"sequence-id": s["id"], **({"sequence-end": "true"} if end else {})}
    if s["kind"] == "rest":
        return clients.rest(value, headers)[:3]
    if s["kind"] == "sse":
        return clients.sse(value, headers)
    return clients.grpc(value, s["id"], **({"sequence_end": True} if end else {}))


def _prove(clients: Clients, replicas: dict[str, tuple[ServerProcess, str, str]]) -> None:
    _wait_for_proxy(clients)
    # kind, id (REST: learnt from the first answer), expected total, replica
    sequences: list[dict[str, Any]] = []
    for k in range(PER):
        total, where, error, sid = clients.rest(k + 1, {"sequence-start": "true"})
        assert error is None and sid is not None and sid.startswith(where + "_"), (error, sid)
        sequences.append({"kind": "rest", "id": sid, "total": k + 1, "replica": where})
        sse_id = f"sse-{k}"
        total, where, error = clients.sse(k + 1, {"sequence-id": sse_id, "sequence-start": "true"})
        assert (total, error) == (k + 1, None)
        sequences.append({"kind": "sse", "id": sse_id, "total": k + 1, "replica": where})
        grpc_id = f"grpc-{k}"
        total, where, error = clients.grpc(k + 1, grpc_id, sequence_start=True)
        assert (total, error) == (k + 1, None)
        sequences.append({"kind": "grpc", "id": grpc_id, "total": k + 1, "replica": where})
    assert len({s["replica"] for s in sequences}) == 3  # round robin spread the starts

    def step(s: dict[str, Any], value: int) -> tuple[int | None, str, str | None]:
        return _step(clients, s, value)

    for value in (10, 100):  # interleaved: every sequence one step per round
        for s in sequences:
            total, where, error = step(s, value)
            s["total"] += value
            assert (total, where, error) == (s["total"], s["replica"], None), s

    # kill -9 a one-process replica (a multi-process one's children need ~1 s to notice
    # their parent's SIGKILL; a pod's death takes them all). r3's error crosses its engine link.
    victim = "r2"
    server = replicas[victim][0]
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=30)
    for s in sequences:
        total, where, error = step(s, 1000)
        if s["replica"] == victim:
            assert total is None and where != victim, (s, where)
            text = not_held_message(s["id"], where)
            assert error == (text if s["kind"] == "grpc" else f"404 sequence_not_held {text}"), s
        else:
            s["total"] += 1000
            assert (total, where, error) == (s["total"], s["replica"], None), s
    # new sequences land on the survivors and are served whole
    for k in range(6):
        total, where, error, sid = clients.rest(k, {"sequence-start": "true"})
        assert (total, error) == (k, None) and where != victim
        again = clients.rest(1, {"sequence-id": sid or ""})
        assert again[:3] == (k + 1, where, None)
        clients.rest(0, {"sequence-id": sid or "", "sequence-end": "true"})
    _drain(clients, replicas["r1"][0], [s for s in sequences if s["replica"] != victim])


def _drain(clients: Clients, draining: ServerProcess, sequences: list[dict[str, Any]]) -> None:
    """SIGTERM r1 (``--drain-timeout 60``): its open sequences go on to their end on it,
    new starts go to r3, and r1 stops once its last sequence has ended."""
    draining.process.send_signal(signal.SIGTERM)
    draining.wait_for(r"draining: \d+ open sequence", 30)
    for value in (10_000, 100_000):
        for s in sequences:
            total, where, error = _step(clients, s, value, end=value == 100_000)
            s["total"] += value
            assert (total, where, error) == (s["total"], s["replica"], None), s
        if value == 10_000:  # between the two rounds: new starts are served by r3 only
            for k in range(4):
                rest = _start(lambda k=k: clients.rest(k, {"sequence-start": "true"})[:3])
                sse = _start(
                    lambda k=k: clients.sse(k, {"sequence-id": f"late-sse-{k}", "sequence-start": "true"})
                )
                assert (rest, sse) == ((k, "r3", None), (k, "r3", None))
    assert draining.process.wait(timeout=30) == 0  # long before its 60 s drain_timeout


# -- the configuration for N replicas ---------------------------------------------------------


def render_module() -> Any:
    """deploy/haproxy/render.py (a script, not a package module), loaded by path."""
    spec = importlib.util.spec_from_file_location("haproxy_render", CONFIG.parent / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proxy_env(addresses: dict[str, tuple[str, str]]) -> dict[str, str]:
    """HAProxy's environment: its two ports (free now) and each replica's REST and gRPC."""
    env = {
        **os.environ,
        "ACTORSERVE_PROXY_REST": f"127.0.0.1:{free_port()}",
        "ACTORSERVE_PROXY_GRPC": f"127.0.0.1:{free_port()}",
    }
    for name, (rest, grpc_address) in addresses.items():
        env[f"ACTORSERVE_{name.upper()}_REST"] = rest
        env[f"ACTORSERVE_{name.upper()}_GRPC"] = grpc_address
    return env


def test_the_shipped_config_is_the_rendered_one_for_three_replicas() -> None:
    assert CONFIG.read_text() == render_module().render(3)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_haproxy_accepts_the_config_rendered_for_n_replicas(tmp_path: Path, replicas: int) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(render_module().render(replicas))
    addresses = {f"r{k}": (f"127.0.0.1:{8000 + k}", f"127.0.0.1:{9000 + k}") for k in range(1, replicas + 1)}
    checked = subprocess.run(
        [haproxy(), "-c", "-f", str(config)], env=proxy_env(addresses), capture_output=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr.decode()


def test_tritonclient_sequences_behind_haproxy_need_the_routing_metadata(tmp_path: Path) -> None:
    """Two replicas: stock tritonclient calls of one sequence (the id in the body only)
    are spread by round robin and told what to add; examples/tritonclient_sticky.py,
    which adds it, is served whole."""
    binary = haproxy()
    servers: list[ServerProcess] = []
    proxy: subprocess.Popen[bytes] | None = None
    try:
        replicas = start_replicas({name: ("--api-workers", "0") for name in ("r1", "r2")}, servers)
        env = proxy_env({name: (rest, grpc_address) for name, (_, rest, grpc_address) in replicas.items()})
        config = tmp_path / "haproxy.cfg"
        config.write_text(render_module().render(2))
        log = (tmp_path / "haproxy.log").open("wb")
        proxy = subprocess.Popen([binary, "-db", "-f", str(config)], env=env, stdout=log, stderr=log)
        clients = Clients(env["ACTORSERVE_PROXY_REST"], env["ACTORSERVE_PROXY_GRPC"])
        try:
            _wait_for_proxy(clients)
        finally:
            clients.close()
        answers = _stock_tritonclient(env["ACTORSERVE_PROXY_GRPC"])
        assert answers[0] == "1"
        hint = routing_hint("stock-1")
        wrong = {f"StatusCode.NOT_FOUND {not_held_message('stock-1', r)}{hint}" for r in replicas}
        assert set(answers[1:]) <= {"2", "3", "4"} | wrong and set(answers[1:]) & wrong, answers
        example = ROOT / "examples" / "tritonclient_sticky.py"
        done = subprocess.run(
            [sys.executable, str(example), "--grpc", env["ACTORSERVE_PROXY_GRPC"]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == ["unary: [1, 3, 6]", "stream: [10, 30, 60]"]
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=10)
            log.close()
        for server in servers:
            server.stop()


def _stock_tritonclient(target: str) -> list[str]:
    """A sequence started, then three more requests, by stock tritonclient (no metadata):
    each answer's total, or its error."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    one = grpcclient.InferInput("INPUT", [1], "INT64")
    one.set_data_from_numpy(np.array([1], dtype=np.int64))
    answers = []
    with grpcclient.InferenceServerClient(target) as client:
        for k in range(4):
            try:
                result = client.infer("accumulator", [one], sequence_id="stock-1", sequence_start=k == 0)
                answers.append(str(result.as_numpy("OUTPUT")[0]))
            except InferenceServerException as exc:
                answers.append(f"{exc.status()} {exc.message()}")
    return answers
