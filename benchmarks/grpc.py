"""gRPC benchmark: unary ModelInfer calls/s and ModelStreamInfer tokens/s.

    python benchmarks/grpc.py [--seconds 3] [--rounds 3] [--baseline CHECKOUT]

Starts its own server process (the engine with the built-in models and ``serve_grpc``
on a free 127.0.0.1 port, no REST) and drives it with ``grpc.aio`` (grpcio's C core)
using pre-serialised requests, so the client costs little:

- unary ``ModelInfer`` on ``identity`` (one FP32 [1,16] tensor) at concurrency 1, 16, 64:
  calls/s and latency percentiles;
- 64 concurrent ``ModelStreamInfer`` streams, each sending ``streamer`` requests of 64
  tokens one after another on its own long-lived stream: tokens/s.

``--otel`` also measures this checkout with tracing on (the SDK making every span, an
exporter that drops them). ``--baseline CHECKOUT`` also starts the same server on the actorserve of another
checkout (e.g. ``git worktree add /tmp/base main``) and measures both; rounds are
interleaved so background load hits both alike. Every phase is bounded (warm-up + fixed
window + timeouts); the script prints numbers and is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

# This file is called grpc.py: keep its folder off sys.path, or `import grpc` finds it
# instead of grpcio.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
grpc_aio: Any = importlib.import_module("grpc.aio")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
READY_TIMEOUT = 60.0
CALL_TIMEOUT = 30.0
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
STREAM_TOKENS = 64


def _requests() -> tuple[bytes, bytes]:
    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    unary = InferenceRequest(
        [tensor_from_numpy("INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16))], id="u"
    )
    text = np.empty(1, dtype=object)
    text[0] = b"tok"
    stream = InferenceRequest(
        [tensor_from_numpy("text_input", text, "BYTES")], id="s", parameters={"n_tokens": STREAM_TOKENS}
    )
    return bytes(request_to_pb(unary, model_name="identity")), bytes(
        request_to_pb(stream, model_name="streamer")
    )


# --------------------------------------------------------------------------- the server process


class ServerProcess:
    """A server in its own process group; its gRPC port is read from its log."""

    def __init__(self, argv: list[str], env: dict[str, str] = ENV) -> None:
        self.proc = subprocess.Popen(
            argv,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.port = self._wait_for_port()

    def _wait_for_port(self) -> int:
        found: list[int] = []
        lines: list[str] = []

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:  # keeps draining, so the server never blocks on the pipe
                lines.append(line)
                match = re.search(r"gRPC listening on [\d.]+:(\d+)", line)
                if match and not found:
                    found.append(int(match.group(1)))

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("server did not start:\n" + "".join(lines[-20:]))
            time.sleep(0.05)
        return found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# --------------------------------------------------------------------------- load


async def _wait_ready(channel: Any) -> None:
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


async def unary(port: int, concurrency: int, seconds: float, body: bytes) -> dict[str, float]:
    """Calls/s and latency of ``concurrency`` callers looping on ModelInfer."""
    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _wait_ready(channel)
        call = channel.unary_unary(MODEL_INFER)
        latencies: list[float] = []
        stop_at = 0.0

        async def worker(record: bool) -> None:
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                await call(body, timeout=CALL_TIMEOUT)
                if record:
                    latencies.append(time.perf_counter() - start)

        stop_at = time.perf_counter() + min(1.0, seconds / 4)  # warm-up
        await asyncio.gather(*(worker(False) for _ in range(concurrency)))
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.wait_for(
            asyncio.gather(*(worker(True) for _ in range(concurrency))), seconds + CALL_TIMEOUT
        )
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "calls_per_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
    }


async def streams(port: int, n_streams: int, seconds: float, body: bytes) -> dict[str, float]:
    """Tokens/s of ``n_streams`` long-lived streams, each sending streamer requests one
    after another and reading their tokens."""
    from actorserve.proto.inference import ModelStreamInferResponse

    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _wait_ready(channel)
        open_stream = channel.stream_stream(STREAM_INFER)
        tokens = [0] * n_streams
        stop_at = time.perf_counter() + seconds + min(1.0, seconds / 4)
        count_from = stop_at - seconds

        async def worker(i: int) -> None:
            call = open_stream(timeout=seconds + CALL_TIMEOUT)
            while time.perf_counter() < stop_at:
                await call.write(body)
                for _ in range(STREAM_TOKENS):
                    message = await call.read()
                    if message is grpc_aio.EOF:
                        raise RuntimeError(f"stream ended early: {await call.code()} {await call.details()}")
                    if time.perf_counter() >= count_from:
                        tokens[i] += 1
            await call.done_writing()
            while (message := await call.read()) is not grpc_aio.EOF:
                reply = ModelStreamInferResponse.FromString(message)
                if reply.error_message:
                    raise RuntimeError(reply.error_message)

        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(worker(i) for i in range(n_streams))), seconds + 2 * CALL_TIMEOUT
        )
        elapsed = time.perf_counter() - max(start, count_from)
    return {"tokens_per_s": sum(tokens) / elapsed, "streams": n_streams}


# --------------------------------------------------------------------------- the server


def serve() -> None:
    """The engine with the built-in models and ``serve_grpc`` on a free port (what
    ``python -m actorserve --http-port off`` runs)."""
    import logging

    import trio

    import actorserve
    from actorserve.models import builtin_settings as builtin_models
    from actorserve.server.doors import serve_grpc
    from actorserve.settings import Settings
    from actorserve.transport.owner import OwnerStamp

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    traced = os.environ.get("BENCH_OTEL") == "1"
    if traced:
        _discarding_tracer_provider()

    async def run() -> None:
        settings = Settings(models=tuple(builtin_models()), host="127.0.0.1", http_port=None, grpc_port=0)
        if traced:
            settings = _with_otel(settings)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with actorserve.open_engine(settings) as engine, trio.open_nursery() as nursery:
                # the doors' engine, as serve_transports gives it (it carries a trace to the engine)
                doors = OwnerStamp(engine, bind=False)
                nursery.start_soon(functools.partial(serve_grpc, doors, settings))
                async for _ in signals:  # stop: serve_grpc drains, then the engine closes
                    nursery.cancel_scope.cancel()
                    break

    trio.run(run)


def _with_otel(settings: Any) -> Any:
    import attrs

    return attrs.evolve(settings, otel=True)


def _discarding_tracer_provider() -> None:
    """``--otel``'s server: the SDK with a batch span processor whose exporter drops what
    it gets, so every span is made, ended and handed to the exporter's thread; only the
    network is left out."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)


# --------------------------------------------------------------------------- main


def _spread(values: list[float]) -> str:
    values = sorted(values)
    median = values[len(values) // 2]
    return f"{median:8.0f}  ({values[0]:.0f}..{values[-1]:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring window per point (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed (default 3)")
    parser.add_argument("--baseline", metavar="CHECKOUT", help="also measure the actorserve in this checkout")
    parser.add_argument(
        "--otel",
        action="store_true",
        help="also measure this checkout with tracing on (--otel, spans discarded)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    unary_body, stream_body = _requests()
    print(
        f"cpus: {os.cpu_count()}  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        f"  ({args.rounds} rounds of {args.seconds:g} s; median (min..max))",
        flush=True,
    )

    servers: dict[str, ServerProcess] = {}
    try:
        servers["this"] = ServerProcess([sys.executable, __file__, "--serve"])
        if args.baseline:
            baseline = os.path.abspath(args.baseline)
            env = {**ENV, "PYTHONPATH": os.pathsep.join([baseline, ENV.get("PYTHONPATH", "")])}
            servers["baseline"] = ServerProcess([sys.executable, __file__, "--serve"], env)
        if args.otel:
            servers["otel"] = ServerProcess([sys.executable, __file__, "--serve"], {**ENV, "BENCH_OTEL": "1"})
        calls: dict[tuple[str, int], list[float]] = {}
        p50: dict[tuple[str, int], list[float]] = {}
        tokens: dict[str, list[float]] = {}
        # Interleaved, so a change in background load hits every variant alike.
        for _ in range(args.rounds):
            for concurrency in (1, 16, 64):
                for label, server in servers.items():
                    r = asyncio.run(unary(server.port, concurrency, args.seconds, unary_body))
                    calls.setdefault((label, concurrency), []).append(r["calls_per_s"])
                    p50.setdefault((label, concurrency), []).append(r["p50_ms"])
            for label, server in servers.items():
                r = asyncio.run(streams(server.port, 64, args.seconds, stream_body))
                tokens.setdefault(label, []).append(r["tokens_per_s"])
        for (label, concurrency), values in sorted(calls.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            median_p50 = sorted(p50[label, concurrency])[len(values) // 2]
            print(
                f"{label:<9} unary ModelInfer  c={concurrency:<3} {_spread(values)} calls/s"
                f"   p50 {median_p50:6.2f} ms",
                flush=True,
            )
        for label, values in tokens.items():
            print(
                f"{label:<9} ModelStreamInfer  64 streams x {STREAM_TOKENS} tokens {_spread(values)} tokens/s",
                flush=True,
            )
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
