"""CPU microseconds per streamed event, per process role (prints numbers; not a test).

    python benchmarks/event_cost.py [--rate 2000] [--seconds 3] [--streams 1,16,64]
                                    [--shapes fronts,one] [--baseline CHECKOUT]

Starts the real server (``python -m actorserve benchmarks/models``) on 127.0.0.1 with free
ports, in the default shape (parent + engine + fronts) and with ``--api-workers 0`` (one
process), and drives the ``streamer`` at a *fixed* event rate over loopback: S streams,
each asking for ``n_tokens`` = rate * seconds / S with ``delay`` = S / rate, so every point
streams the same number of events in the same time whatever S is. Transports: SSE
``infer_stream`` (aiohttp) and gRPC ``ModelStreamInfer`` (grpc.aio, pre-serialised request).

For each point it reads the user + system CPU time of every server process (psutil, all
threads) before and after and prints it divided by the events received, per role: the
engine process, the fronts summed, and the parent (the supervisor; in the one-process
shape the single process is reported as the engine and the fronts column is empty).
On a shared, noisy machine this moves far less than throughput does, and it is what the
issue budgets (engine <= 6 us, front <= 10 us per event at 64 streams).

``--baseline CHECKOUT`` also runs the same servers from another checkout (``git worktree
add --detach /tmp/base main``); every point is measured on both, alternating, and the
median of ``--rounds`` runs is printed side by side. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
# keep this folder off sys.path, or `import grpc` finds benchmarks/grpc.py
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import psutil

grpc_aio: Any = importlib.import_module("grpc.aio")

ROOT = Path(_HERE).parent
MODELS = ROOT / "benchmarks" / "models"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
READY_TIMEOUT = 60.0
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SHAPES = {"fronts": [], "one": ["--api-workers", "0"]}


class Server:
    """One server (any shape) started from ``checkout``, in its own process group."""

    def __init__(self, checkout: Path, shape: str) -> None:
        argv = [sys.executable, "-m", "actorserve", str(MODELS), "--http-port", "0", "--grpc-port", "0"]
        env = {**ENV, "PYTHONPATH": str(checkout)}
        self.proc = subprocess.Popen(
            argv + SHAPES[shape],
            cwd=checkout,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.http = self.grpc = 0
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not (self.http and self.grpc):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("server did not start:\n" + "".join(self.lines[-20:]))
            time.sleep(0.05)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # keeps draining, so the server never blocks on the pipe
            self.lines.append(line)
            if match := re.search(r"REST listening on http://[\d.]+:(\d+)", line):
                self.http = self.http or int(match.group(1))
            if match := re.search(r"gRPC listening on [\d.]+:(\d+)", line):
                self.grpc = self.grpc or int(match.group(1))

    def roles(self) -> dict[str, list[psutil.Process]]:
        """The server's processes by role: ``engine``, ``fronts``, ``parent``."""
        parent = psutil.Process(self.proc.pid)
        children = parent.children(recursive=True)
        if not children:
            return {"engine": [parent], "fronts": [], "parent": []}
        roles: dict[str, list[psutil.Process]] = {"engine": [], "fronts": [], "parent": [parent]}
        for child in children:
            role = child.environ().get("_ACTORSERVE_ROLE", "")
            roles["engine" if role == "engine" else "fronts"].append(child)
        return roles

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def cpu_seconds(roles: dict[str, list[psutil.Process]]) -> dict[str, float]:
    return {role: sum(sum(p.cpu_times()[:2]) for p in procs) for role, procs in roles.items()}


def stream_body(n_tokens: int, delay: float) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["tok"]}],
        "parameters": {"n_tokens": n_tokens, "delay": delay},
    }


async def sse_point(port: int, streams: int, n_tokens: int, delay: float) -> int:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v2/models/streamer/infer_stream"
    body = stream_body(n_tokens, delay)

    async def one(session: Any) -> int:
        count = 0
        async with session.post(url, json=body) as reply:
            assert reply.status == 200, await reply.text()
            async for line in reply.content:
                count += line.startswith(b"data: ")
        return count

    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector) as session:
        counts = await asyncio.gather(*(one(session) for _ in range(streams)))
    return sum(counts)


def grpc_request(n_tokens: int, delay: float) -> bytes:
    import numpy as np

    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    text = np.empty(1, dtype=object)
    text[0] = b"tok"
    request = InferenceRequest(
        [tensor_from_numpy("text_input", text, "BYTES")],
        id="s",
        parameters={"n_tokens": n_tokens, "delay": delay},
    )
    return bytes(request_to_pb(request, model_name="streamer"))


async def grpc_point(port: int, streams: int, n_tokens: int, delay: float) -> int:
    body = grpc_request(n_tokens, delay)
    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        open_stream = channel.stream_stream(STREAM_INFER)

        async def one() -> int:
            call = open_stream()
            await call.write(body)
            await call.done_writing()
            count = 0
            while (message := await call.read()) is not grpc_aio.EOF:
                count += 1
                if count > n_tokens + 1:
                    raise RuntimeError(f"more than {n_tokens} messages: {message!r}")
            return count

        counts = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(counts)


def measure(server: Server, transport: str, streams: int, rate: float, seconds: float) -> dict[str, float]:
    n_tokens = max(1, round(rate * seconds / streams))
    delay = streams / rate
    point = sse_point if transport == "sse" else grpc_point
    port = server.http if transport == "sse" else server.grpc
    roles = server.roles()
    before = cpu_seconds(roles)
    events = asyncio.run(asyncio.wait_for(point(port, streams, n_tokens, delay), seconds * 4 + 30))
    after = cpu_seconds(roles)
    if events != streams * n_tokens:
        raise SystemExit(f"{transport} {streams} streams: {events} events, expected {streams * n_tokens}")
    return {role: 1e6 * (after[role] - before[role]) / events for role in before if roles[role]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=2000.0, help="events per second, all streams together")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one point")
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--transports", default="sse,grpc")
    parser.add_argument(
        "--shapes", default="fronts,one", help="fronts: the default shape; one: --api-workers 0"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured alternately")
    args = parser.parse_args()
    checkouts = {"this": ROOT} | ({"base": args.baseline.resolve()} if args.baseline else {})
    print(
        f"rate {args.rate:.0f} events/s, {args.seconds:.0f} s per point; CPU us per event (median of "
        f"{args.rounds}): engine / fronts summed / parent",
        flush=True,
    )
    for shape in args.shapes.split(","):
        servers = {name: Server(path, shape) for name, path in checkouts.items()}
        try:
            for server in servers.values():  # warm-up: imports, first-call paths
                for transport in args.transports.split(","):
                    measure(server, transport, 4, args.rate, 0.5)
            for name, server in servers.items():  # what the server burns with nothing to do
                roles = server.roles()
                before = cpu_seconds(roles)
                time.sleep(1.0)
                idle = cpu_seconds(roles)
                print(
                    f"{shape:<6} idle: {name} "
                    + " / ".join(f"{1e3 * (idle[r] - before[r]):.0f}" for r in idle)
                    + " ms CPU per second",
                    flush=True,
                )
            for transport in args.transports.split(","):
                for streams in (int(s) for s in args.streams.split(",")):
                    runs: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
                    for _ in range(args.rounds):
                        for name, server in servers.items():
                            runs[name].append(measure(server, transport, streams, args.rate, args.seconds))
                    cells = []
                    for name, results in runs.items():
                        roles = results[0].keys()
                        median = {r: statistics.median(run[r] for run in results) for r in roles}
                        cells.append(
                            f"{name}: "
                            + " / ".join(
                                f"{median.get(r, 0):5.1f}" if r in median else "    -"
                                for r in ("engine", "fronts", "parent")
                            )
                        )
                    print(
                        f"{shape:<6} {transport:<4} {streams:>3} streams   " + "   ".join(cells), flush=True
                    )
        finally:
            for server in servers.values():
                server.stop()


if __name__ == "__main__":
    main()
