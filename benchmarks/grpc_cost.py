"""CPU time per gRPC call / streamed message in the server's processes (not throughput).

    python benchmarks/grpc_cost.py [--calls 3000] [--concurrency 16] [--phases unary,stream]
                                   [--api-workers 1] [--baseline CHECKOUT] [--profile FILE]

Starts ``python -m actorserve --http-port off --grpc-port 0`` (built-in models, on
127.0.0.1) and drives it with ``grpc.aio`` (grpcio's C core, pre-serialised requests, so
the client costs little and runs outside the server):

- ``--calls`` unary ``ModelInfer`` on ``identity`` (one FP32 [1,16] tensor),
  ``--concurrency`` (16) at a time on one channel;
- ``--concurrency`` ``ModelStreamInfer`` streams, each sending its share of ``--calls``
  ``identity`` requests (16 in flight per stream) and reading one response per request.

``--phases`` picks which of the two run (both by default).

It reads ``psutil`` CPU times (user + system) of every server process before and after
each phase and prints microseconds of CPU per call / message, front(s) and engine apart.
On a shared machine wall-clock throughput is noise; CPU per call is what a change moves.
``--baseline CHECKOUT`` measures another checkout's actorserve the same way, interleaved
round by round. ``--profile FILE`` runs a one-process server (``--api-workers 0``) under
cProfile and writes its stats to FILE when it stops. Every wait is bounded.
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
from typing import Any

import numpy as np
import psutil

# Keep this folder off sys.path, or `import grpc` finds benchmarks/grpc.py.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
grpc_aio: Any = importlib.import_module("grpc.aio")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
READY_TIMEOUT = 90.0
CALL_TIMEOUT = 30.0
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
CONCURRENCY = 16


def _request() -> bytes:
    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    tensor = tensor_from_numpy("INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16))
    return bytes(request_to_pb(InferenceRequest([tensor], id="u"), model_name="identity"))


class Server:
    """``python -m actorserve`` in its own process group; the port is read from its log."""

    def __init__(self, checkout: str | None, api_workers: int, profile: str | None) -> None:
        # this checkout's actorserve (or the baseline's), whatever the venv has installed
        root = os.path.abspath(checkout or os.path.dirname(_HERE))
        env = {**ENV, "PYTHONPATH": os.pathsep.join([root, ENV.get("PYTHONPATH", "")])}
        if profile:  # the CLI ends with os._exit, which would lose cProfile's stats
            argv = [sys.executable, __file__, "--serve-profiled", profile]
            api_workers = 0
        else:
            argv = [sys.executable, "-m", "actorserve", "--host", "127.0.0.1", "--http-port", "off"]
            argv += ["--grpc-port", "0", "--api-workers", str(api_workers)]
        self.api_workers = api_workers
        self.proc = subprocess.Popen(
            argv,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            text=True,
            start_new_session=True,
            cwd=root,  # ``-m`` puts the working directory first on sys.path
        )
        self.lines: list[str] = []
        self.port = self._wait_for_port()

    def _wait_for_port(self) -> int:
        found: list[int] = []

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:  # keeps draining, so the server never blocks on the pipe
                self.lines.append(line)
                match = re.search(r"gRPC listening on [\d.]+:(\d+)", line)
                if match and not found:
                    found.append(int(match.group(1)))

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("server did not start:\n" + "".join(self.lines[-20:]))
            time.sleep(0.05)
        return found[0]

    def processes(self) -> dict[str, psutil.Process]:
        """``{"front N" | "engine" | "one process": process}`` (the parent only supervises)."""
        root = psutil.Process(self.proc.pid)
        if self.api_workers == 0:
            return {"one process": root}
        named: dict[str, psutil.Process] = {}
        fronts = 0
        for child in root.children(recursive=True):
            if child.environ().get("_ACTORSERVE_ROLE") == "engine":
                named["engine"] = child
            else:
                fronts += 1
                named[f"front {fronts}"] = child
        return named

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _cpu(processes: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, process in processes.items():
        times = process.cpu_times()
        out[name] = times.user + times.system
    return out


async def _ready(channel: Any) -> None:
    ready = channel.unary_unary(SERVER_READY)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            await ready(b"", timeout=2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def unary(port: int, calls: int, body: bytes, concurrency: int = CONCURRENCY) -> None:
    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _ready(channel)
        call = channel.unary_unary(MODEL_INFER)
        left = [calls]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await call(body, timeout=CALL_TIMEOUT)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), calls + CALL_TIMEOUT)


async def streams(port: int, messages: int, body: bytes, concurrency: int = CONCURRENCY) -> None:
    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _ready(channel)
        open_stream = channel.stream_stream(STREAM_INFER)

        async def one() -> None:
            call = open_stream(timeout=messages + CALL_TIMEOUT)
            sent = received = 0
            while received < messages:
                while sent < messages and sent - received < CONCURRENCY:
                    await call.write(body)
                    sent += 1
                reply = await call.read()
                if reply is grpc_aio.EOF:
                    raise RuntimeError(f"stream ended early: {await call.code()} {await call.details()}")
                received += 1
            await call.done_writing()
            while await call.read() is not grpc_aio.EOF:
                pass

        await asyncio.wait_for(
            asyncio.gather(*(one() for _ in range(concurrency))), messages + 2 * CALL_TIMEOUT
        )


def measure(
    server: Server, phase: str, count: int, body: bytes, concurrency: int = CONCURRENCY
) -> dict[str, float]:
    """Microseconds of CPU per call / message, per server process."""
    processes = server.processes()
    before = _cpu(processes)
    if phase == "unary":
        asyncio.run(unary(server.port, count, body, concurrency))
    else:
        count = count // concurrency * concurrency
        asyncio.run(streams(server.port, count // concurrency, body, concurrency))
    after = _cpu(processes)
    return {name: (after[name] - before[name]) / count * 1e6 for name in processes}


def serve_profiled(path: str) -> None:
    """The engine with the built-in models and ``serve_grpc`` in this process, under
    cProfile until SIGINT; the stats go to ``path``."""
    import cProfile
    import functools
    import logging

    import trio

    import actorserve
    from actorserve.models import builtin_settings
    from actorserve.server.doors import serve_grpc
    from actorserve.settings import Settings

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    async def run() -> None:
        settings = Settings(models=tuple(builtin_settings()), host="127.0.0.1", http_port=None, grpc_port=0)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with actorserve.open_engine(settings) as engine, trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(serve_grpc, engine, settings))
                async for _ in signals:  # stop: serve_grpc drains, then the engine closes
                    nursery.cancel_scope.cancel()
                    break

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        trio.run(run)
    finally:
        profiler.disable()
        profiler.dump_stats(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="unary calls and streamed messages per round")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="calls / streams at a time")
    parser.add_argument("--phases", default="unary,stream", help="unary, stream or both (default)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed (default 3)")
    parser.add_argument("--api-workers", type=int, default=1, help="front processes (0: one process)")
    parser.add_argument("--baseline", metavar="CHECKOUT", help="also measure the actorserve in this checkout")
    parser.add_argument("--profile", metavar="FILE", help="one process under cProfile; stats written to FILE")
    parser.add_argument("--serve-profiled", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_profiled:
        serve_profiled(args.serve_profiled)
        return
    body = _request()
    print(
        f"cpus: {os.cpu_count()}  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True
    )
    checkouts = {"this": None, **({"baseline": args.baseline} if args.baseline else {})}
    servers: dict[str, Server] = {}
    results: dict[tuple[str, str, str], list[float]] = {}
    try:
        for label, checkout in checkouts.items():
            servers[label] = Server(checkout, args.api_workers, args.profile)
        phases = [phase.strip() for phase in args.phases.split(",")]
        for server in servers.values():  # warm-up: imports, first calls, caches
            for phase in phases:
                measure(server, phase, 320, body, args.concurrency)
        for _ in range(args.rounds):
            for phase in phases:
                for label, server in servers.items():
                    for name, us in measure(server, phase, args.calls, body, args.concurrency).items():
                        results.setdefault((phase, label, name), []).append(us)
    finally:
        for server in servers.values():
            server.stop()
    print(
        f"CPU microseconds per unary call / streamed message, {args.concurrency} at a time (median of rounds):"
    )
    for (phase, label, name), values in sorted(results.items()):
        print(
            f"  {phase:7s} {label:9s} {name:12s} {statistics.median(values):8.1f}  {sorted(round(v) for v in values)}"
        )


if __name__ == "__main__":
    main()
