"""Memory of the server's process tree by role, idle and under W6 (prints numbers; not a test).

    python benchmarks/memory.py [--shapes fronts,one] [--mlserver] [--seconds 8]
                                [--streams 64] [--tokens 64] [--settle 5] [--rounds 1]

Starts the real server (``python -m actorserve benchmarks/models``) on 127.0.0.1 with free
ports, in the default shape (parent + engine + fronts) and with ``--api-workers 0`` (one
process), using :class:`event_cost.Server` and its role detection, and reads the memory of
every process of the tree (psutil ``memory_full_info()``: RSS, PSS and USS) by role: the
engine, the fronts summed, the parent; in the one-process shape the single process is the
engine. ``total`` is the per-sample sum over the tree; of the three, only PSS adds up
(RSS counts each shared page, e.g. a shared library's code, in every process that maps it;
USS counts it in none).

Phases, one after the other on the same server:

``idle``
    after start-up and a short warm-up (a few streams over SSE and gRPC), the mean of
    ``--idle`` seconds of samples;
``sse`` / ``grpc``
    W6: ``--streams`` concurrent ``stepper`` streams of ``--tokens`` tokens, closed loop for
    ``--seconds`` (each worker starts its next stream as soon as the last one ends; streams
    running at the deadline finish), SSE ``generate_stream`` (aiohttp) and then gRPC
    ``ModelStreamInfer`` (grpc.aio); sampled every ``--interval`` seconds, peak and mean;
``after``
    idle again, ``--settle`` seconds after the load (actorserve trims its heap once a busy
    process goes idle, ``actorserve/server/heaptrim.py``), the mean of ``--idle`` seconds.

``--rounds N`` repeats the load phases and the idle reading after them N times on the same
server, so memory that plateaus after the first load tells itself apart from a leak.

``--mlserver`` also measures MLServer 1.7.1 (its venv ``--mlserver-venv``) as the side by
side harness starts it (``--mlserver-peer``, required with ``--mlserver``: the harness's
``peers/mlserver`` folder, with its peer.json env, the ``main`` profile, i.e.
``parallel_workers`` 0, and its model repository), on free loopback ports: the repository
is copied to a temporary folder whose ``settings.json`` names them (MLServer takes its
ports from that file before its environment). Its whole tree is one role.

Every wait is bounded and every server is stopped (SIGINT to its process group, then
SIGKILL; then whatever is left of its tree is killed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

_HERE = os.path.dirname(os.path.abspath(__file__))
# this folder goes last on sys.path, so `import grpc` finds grpcio before benchmarks/grpc.py
# and `import event_cost` still finds its sibling
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE] + [_HERE]

import event_cost
import psutil

MIB = 1 << 20
MODEL = "stepper"
PROMPT = "hello"
#: seconds one stream may take before it counts as failed
STREAM_TIMEOUT = 60.0
#: seconds past ``--seconds`` that the streams running at the deadline may take to end
TAIL = STREAM_TIMEOUT + 10.0
MLSERVER_VENV = Path("/tmp/bench/mlserver")
MLSERVER_READY_TIMEOUT = 120.0


class Mem(NamedTuple):
    """Bytes of one process or of a sum of them."""

    rss: int
    pss: int
    uss: int

    def __add__(self, other: object) -> Mem:
        if not isinstance(other, Mem):
            return NotImplemented
        return Mem(self.rss + other.rss, self.pss + other.pss, self.uss + other.uss)


NO_MEM = Mem(0, 0, 0)
Sample = dict[str, Mem]


class Tree(Protocol):
    """A started server: its ports, its processes by role, and how to stop it."""

    http: int
    grpc: int

    def roles(self) -> dict[str, list[psutil.Process]]: ...

    def stop(self) -> None: ...


def snapshot(roles: Mapping[str, Sequence[psutil.Process]]) -> Sample:
    """Memory per role (summed over its processes) and ``total``; a process gone counts 0."""
    sample: Sample = {}
    for role, procs in roles.items():
        if not procs:
            continue
        summed = NO_MEM
        for proc in procs:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            summed += Mem(info.rss, info.pss, info.uss)
        sample[role] = summed
    sample["total"] = sum(sample.values(), NO_MEM)
    return sample


def peak(samples: Sequence[Sample]) -> Sample:
    """The largest value of each role and metric over the samples (each on its own)."""
    return {role: Mem(*(max(s[role][k] for s in samples) for k in range(3))) for role in samples[0]}


def mean(samples: Sequence[Sample]) -> Sample:
    return {
        role: Mem(*(round(statistics.fmean(s[role][k] for s in samples)) for k in range(3)))
        for role in samples[0]
    }


class Sampler:
    """Samples ``roles`` every ``interval`` seconds in a thread, from entry to exit."""

    def __init__(self, roles: Mapping[str, Sequence[psutil.Process]], interval: float) -> None:
        self.roles = roles
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.samples.append(snapshot(self.roles))
        while not self._stop.wait(self.interval):
            self.samples.append(snapshot(self.roles))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10 * self.interval + 10)


def sample_for(roles: Mapping[str, Sequence[psutil.Process]], seconds: float, interval: float) -> Sample:
    """The mean of ``seconds`` of samples, the server left alone."""
    with Sampler(roles, interval) as sampler:
        time.sleep(seconds)
    return mean(sampler.samples)


# --- W6 load -------------------------------------------------------------------------------


def sse_body(tokens: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
        "parameters": {"n_tokens": tokens},
    }


def grpc_request(tokens: int) -> bytes:
    """W6's ``ModelInferRequest``: typed BYTES contents and ``n_tokens`` as int64, no delay."""
    import numpy as np

    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    text = np.empty(1, dtype=object)
    text[0] = PROMPT.encode()
    request = InferenceRequest(
        [tensor_from_numpy("text_input", text, "BYTES")], parameters={"n_tokens": tokens}
    )
    return bytes(request_to_pb(request, raw=False, model_name=MODEL))


async def closed_loop(one: Callable[[], Awaitable[int]], streams: int, seconds: float) -> int:
    """``streams`` workers calling ``one`` back to back until ``seconds`` pass; tokens received."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while loop.time() < deadline:
            got = await one()  # not `tokens += await one()`: that reads `tokens` before the await
            tokens += got

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(streams))), seconds + TAIL)
    return tokens


async def sse_load(port: int, streams: int, tokens: int, seconds: float) -> int:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v2/models/{MODEL}/generate_stream"
    body = sse_body(tokens)
    timeout = aiohttp.ClientTimeout(total=STREAM_TIMEOUT)

    async def one() -> int:
        count = 0
        async with session.post(url, json=body) as reply:
            if reply.status != 200:
                raise SystemExit(f"SSE {url}: {reply.status} {await reply.text()}")
            async for line in reply.content:
                count += line.startswith(b"data: ")
        if count != tokens:
            raise SystemExit(f"SSE {url}: {count} events, expected {tokens}")
        return count

    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return await closed_loop(one, streams, seconds)


async def grpc_load(port: int, streams: int, tokens: int, seconds: float) -> int:
    body = grpc_request(tokens)
    grpc_aio = event_cost.grpc_aio
    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        open_stream = channel.stream_stream(event_cost.STREAM_INFER)

        async def one() -> int:
            call = open_stream(timeout=STREAM_TIMEOUT)
            await call.write(body)
            await call.done_writing()
            count = 0
            while await call.read() is not grpc_aio.EOF:
                count += 1
                if count > tokens:
                    raise SystemExit(f"gRPC: more than {tokens} messages in one stream")
            if count != tokens:
                raise SystemExit(f"gRPC: {count} messages, expected {tokens}")
            return count

        return await closed_loop(one, streams, seconds)


LOADS = {"sse": sse_load, "grpc": grpc_load}


def under_load(server: Tree, transport: str, args: argparse.Namespace) -> tuple[list[Sample], float]:
    """W6 over ``transport`` while sampling; the samples and the tokens per second."""
    port = server.http if transport == "sse" else server.grpc
    with Sampler(server.roles(), args.interval) as sampler:
        start = time.monotonic()
        tokens = asyncio.run(LOADS[transport](port, args.streams, args.tokens, args.seconds))
        took = time.monotonic() - start
    return sampler.samples, tokens / took


# --- MLServer ------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 just now (held together, so they differ)."""
    with bound_sockets(count) as socks:
        return [s.getsockname()[1] for s in socks]


@contextlib.contextmanager
def bound_sockets(count: int) -> Iterator[list[socket.socket]]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        yield socks
    finally:
        for s in socks:
            s.close()


def peer_env(peer: Mapping[str, Any], profile: str, peer_dir: Path) -> dict[str, str]:
    """The environment the harness gives the peer: peer.json's ``env``, then the profile's."""
    env = {**peer.get("env", {}), **peer["profiles"][profile].get("env", {})}
    return {k: str(v).replace("{peer_dir}", str(peer_dir)) for k, v in env.items()}


class MLServer:
    """MLServer from ``venv`` serving a copy of the peer's repository, on free ports."""

    def __init__(self, peer_dir: Path, venv: Path, workdir: Path) -> None:
        peer = json.loads((peer_dir / "peer.json").read_text())
        repo = workdir / "models"
        shutil.copytree(peer_dir / "models", repo)
        settings = json.loads((repo / "settings.json").read_text())
        self.http, self.grpc, metrics = free_ports(3)
        settings.update(host="127.0.0.1", http_port=self.http, grpc_port=self.grpc, metrics_port=metrics)
        (repo / "settings.json").write_text(json.dumps(settings))
        env = {**os.environ, **peer_env(peer, "main", peer_dir)}
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "mlserver"), "start", str(repo)],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + MLSERVER_READY_TIMEOUT
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("MLServer did not start:\n" + "".join(self.lines[-20:]))
            time.sleep(0.2)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # keeps draining, so the server never blocks on the pipe
            self.lines.append(line)

    def _ready(self) -> bool:
        for path in ("/v2/health/ready", f"/v2/models/{MODEL}/ready"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=2) as reply:
                    if reply.status != 200:
                        return False
            except OSError:
                return False
        return True

    def roles(self) -> dict[str, list[psutil.Process]]:
        parent = psutil.Process(self.proc.pid)
        return {"tree": [parent, *parent.children(recursive=True)]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# --- report --------------------------------------------------------------------------------


#: the table's columns; a role a server lacks (MLServer's tree is one role) is ``-``
COLUMNS = ("engine", "fronts", "parent", "total")
HEADER = (
    "| server | phase | "
    + " | ".join(f"{c} RSS / PSS / USS" for c in COLUMNS)
    + " | tok/s |\n|---|---|"
    + "---:|" * (len(COLUMNS) + 1)
)


def row(label: str, phase: str, sample: Sample, rate: str = "") -> str:
    cells = [" / ".join(f"{v / MIB:.0f}" for v in sample[c]) if c in sample else "-" for c in COLUMNS]
    return f"| {label} | {phase} | " + " | ".join(cells) + f" | {rate} |"


def measure(label: str, server: Tree, args: argparse.Namespace) -> list[str]:
    """The table rows of one server: idle, each transport's peak and mean, idle after."""
    roles = server.roles()
    print(f"{label}: " + ", ".join(f"{len(procs)} {r}" for r, procs in roles.items() if procs), flush=True)
    for transport in args.transports:  # warm-up: imports, first-call paths
        asyncio.run(LOADS[transport](server.http if transport == "sse" else server.grpc, 4, 8, 0.5))
    time.sleep(args.settle)
    rows = [row(label, "idle", sample_for(roles, args.idle, args.interval))]
    for round_ in range(1, args.rounds + 1):
        tag = f" ({round_})" if args.rounds > 1 else ""
        for transport in args.transports:
            samples, rate = under_load(server, transport, args)
            rows.append(row(label, f"W6 {transport} peak{tag}", peak(samples), f"{rate:,.0f}"))
            rows.append(row(label, f"W6 {transport} mean{tag}", mean(samples)))
        time.sleep(args.settle)
        idle = sample_for(roles, args.idle, args.interval)
        rows.append(row(label, f"idle after {args.settle:g} s{tag}", idle))
    print(HEADER, *rows, sep="\n", flush=True)
    return rows


def stop_tree(server: Tree) -> None:
    """Stop the server, then kill what is left of its tree: actorserve's children run in
    sessions of their own, out of reach of the signal to the parent's group."""
    try:
        procs = [proc for procs in server.roles().values() for proc in procs]
    except psutil.NoSuchProcess:  # the parent is gone already
        procs = []
    server.stop()
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.is_running():
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", default="fronts,one", help="fronts: the default shape; one: --api-workers 0"
    )
    parser.add_argument("--checkout", type=Path, default=event_cost.ROOT, help="the actorserve tree to run")
    parser.add_argument("--mlserver", action="store_true", help="also MLServer 1.7.1 (profile main)")
    parser.add_argument(
        "--mlserver-peer",
        type=Path,
        help="the side by side harness's peers/mlserver folder (with --mlserver)",
    )
    parser.add_argument("--mlserver-venv", type=Path, default=MLSERVER_VENV)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0, help="closed-loop load per transport")
    parser.add_argument("--transports", type=lambda s: s.split(","), default=["sse", "grpc"])
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    parser.add_argument(
        "--rounds", type=int, default=1, help="load phases again: a plateau, or memory that keeps growing?"
    )
    parser.add_argument("--idle", type=float, default=1.0, help="seconds of samples per idle reading")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds left idle before idle readings")
    args = parser.parse_args()
    if args.mlserver and (args.mlserver_peer is None or not (args.mlserver_peer / "peer.json").is_file()):
        # nothing is read outside this tree unless named: the harness is not part of the repository
        parser.error("--mlserver needs --mlserver-peer FOLDER holding the harness's peer.json and models/")
    print(
        f"W6: {args.streams} x {MODEL} streams of {args.tokens} tokens, closed loop, {args.seconds:g} s per "
        f"transport; MiB: RSS / PSS / USS per role (summed over its processes), every {args.interval:g} s",
        flush=True,
    )
    servers: list[tuple[str, Callable[[], Tree]]] = [
        (f"actorserve {shape}", lambda shape=shape: event_cost.Server(args.checkout.resolve(), shape))
        for shape in args.shapes.split(",")
        if shape
    ]
    workdir = Path(tempfile.mkdtemp(prefix="memory-mlserver-"))
    if args.mlserver:
        servers.append(("MLServer", lambda: MLServer(args.mlserver_peer, args.mlserver_venv, workdir)))
    try:
        tables = []
        for label, start in servers:
            server = start()
            try:
                tables.append(measure(label, server, args))
            finally:
                stop_tree(server)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nall servers:", HEADER, *(r for rows in tables for r in rows), sep="\n")


if __name__ == "__main__":
    main()
