"""REST throughput and latency (prints numbers; not a test).

    python benchmarks/rest.py [--duration 5] [--mode fast|quart|both] [--only sse,itl]

Starts actorserve (built-in models) in a subprocess on 127.0.0.1 with a free port, then
measures from this process with aiohttp (keep-alive connections):

- unary ``infer`` on ``identity`` (JSON, 16 FP32 values): req/s, p50 and p99 latency at
  concurrency 1, 16 and 64 (and one binary-tensor run at 16);
- SSE events/s of one ``infer_stream`` of the ``streamer`` (a plain Model: one response
  at a time) with n_tokens=10000, and tokens/s of 64 concurrent streams;
- the same two points on ``ticker``, a BatchModel with no compute (one token per stream
  per step), where a stream that fell behind catches up in one coalesced write;
- ITL at c=1: the p50 / p99 gap between events of one stream paced by the model
  (``streamer`` with delay=2 ms), i.e. what a lone event costs on top of the pacing.

Next to each throughput the server's own CPU time per request or event is printed (from
``/proc``, user + system, all threads): on a shared, noisy machine it moves much less
than the rate, and it is what a transport change changes.

``--mode`` picks the front door for ``infer``: the raw-ASGI fast path, Quart, or both.
Each scenario runs ``--rounds`` times per server, alternating servers round by round
(so load from elsewhere on the machine hits both alike), and the median run is printed.
Every unary run lasts ``--duration`` seconds; a stream run, its token count.
``--baseline CHECKOUT`` adds a server on another checkout's actorserve (``base``), ``--otel``
one with tracing on (``otel``: the SDK makes every span, an exporter drops them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

UNARY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [float(i) for i in range(16)]}
        ]
    }
).encode()


def binary_unary() -> tuple[bytes, dict[str, str]]:
    import numpy as np

    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 16],
                    "parameters": {"binary_data_size": 64},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return head + np.arange(16, dtype=np.float32).tobytes(), {
        "Inference-Header-Content-Length": str(len(head))
    }


# -- the server side (a child process) ---------------------------------------------------


def ticker_settings() -> Any:
    """``ticker``: the streamer's contract as a BatchModel with no compute, so the SSE
    points measure the transport (one token per active stream per step)."""
    import numpy as np

    from actorserve import BatchModel, InferenceRequest, ModelSettings, StepOutput
    from actorserve.model import int_parameter, text_input
    from actorserve.types import Tensor

    class Tick:
        __slots__ = ("emitted", "prompt", "request", "tokens")

        def __init__(self, request: InferenceRequest, prompt: str, tokens: int) -> None:
            self.request, self.prompt, self.tokens, self.emitted = request, prompt, tokens, 0

    class TickerModel(BatchModel[None, Tick]):
        default_max_batch_size = 64

        def begin(self, request: InferenceRequest, state: None) -> Tick:
            prompt = text_input(request, "text_input", default="tok")
            return Tick(request, prompt, int_parameter(request, "n_tokens", 5, minimum=0, maximum=100_000))

        def step(self, batch: list[Tick]) -> list[StepOutput]:
            outputs = []
            for tick in batch:
                if tick.emitted >= tick.tokens:
                    outputs.append(StepOutput(done=True))
                    continue
                k = tick.emitted
                tick.emitted += 1
                text = np.empty(1, dtype=object)
                text[0] = f"{tick.prompt}:{k}".encode()
                tensors = [
                    Tensor("text_output", (1,), "BYTES", text),
                    Tensor("index", (1,), "INT64", np.array([k])),
                ]
                outputs.append(
                    StepOutput(self.response(tick.request, tensors), done=tick.emitted >= tick.tokens)
                )
            return outputs

    return ModelSettings(name="ticker", implementation=TickerModel, max_batch_size=64)


def serve_forever(fast_path: bool) -> None:
    import trio

    import actorserve
    from actorserve.models import builtin_settings as builtin_models
    from actorserve.server.composition import serve

    traced = os.environ.get("BENCH_OTEL") == "1"
    if traced:
        discarding_tracer_provider()

    async def main() -> None:
        settings = actorserve.Settings(
            models=(*builtin_models(), ticker_settings()),
            host="127.0.0.1",
            http_port=0,
            grpc_port=None,
            grace_period=1.0,
            **({"otel": True} if traced else {}),
        )
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve, settings, rest_fast_path=fast_path))
            print(server.http_url, flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
            server.shutdown()

    trio.run(main)


def discarding_tracer_provider() -> None:
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


#: a variant's environment: ``--baseline``'s checkout, ``--otel``'s tracing
VARIANT_ENV: dict[str, dict[str, str]] = {}


def start_server(fast_path: bool, name: str = "") -> tuple[subprocess.Popen[str], str]:
    args = [sys.executable, __file__, "--serve"] + ([] if fast_path else ["--no-fast-path"])
    env = {**os.environ, **VARIANT_ENV.get(name, {})}
    process = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        process.kill()
        raise SystemExit(f"the server did not start (got {url!r})")
    return process, url


# -- the client side ---------------------------------------------------------------------


async def unary(
    url: str, concurrency: int, duration: float, body: bytes, headers: dict[str, str]
) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    served = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        target = f"{url}/v2/models/identity/infer"
        warmup_end = time.perf_counter() + min(1.0, duration / 4)
        end = warmup_end + duration

        async def worker() -> None:
            nonlocal errors, served
            while (start := time.perf_counter()) < end:
                async with session.post(target, data=body, headers=headers) as reply:
                    await reply.read()
                    ok = reply.status == 200
                now = time.perf_counter()
                served += 1
                if start >= warmup_end:
                    if ok:
                        latencies.append(now - start)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    latencies.sort()
    return {
        "req_s": len(latencies) / duration,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "errors": errors,
        "served": served,
    }


async def stream_events(
    session: Any,
    url: str,
    n_tokens: int,
    model: str = "streamer",
    delay: float = 0.0,
    gaps: list[float] | None = None,
) -> int:
    parameters: dict[str, Any] = {"n_tokens": n_tokens}
    if delay:
        parameters["delay"] = delay
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["t"]}],
        "parameters": parameters,
    }
    count = 0
    last = 0.0
    async with session.post(f"{url}/v2/models/{model}/infer_stream", json=body) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if line.startswith(b"data: "):
                now = time.perf_counter()
                if gaps is not None and count:
                    gaps.append(now - last)
                last = now
                count += 1
    assert count == n_tokens, (count, n_tokens)
    return count


async def streams(url: str, concurrent: int, n_tokens: int, model: str = "streamer") -> float:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrent), timeout=timeout
    ) as session:
        await stream_events(session, url, 10, model)  # warm up
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(stream_events(session, url, n_tokens, model) for _ in range(concurrent))
        )
        elapsed = time.perf_counter() - start
    return sum(counts) / elapsed


ITL_DELAY = 0.002


async def inter_token_latency(url: str, n_tokens: int = 500) -> dict[str, float]:
    """p50 / p99 gap (ms) between the events of one stream paced at ITL_DELAY."""
    import aiohttp

    gaps: list[float] = []
    async with aiohttp.ClientSession() as session:
        await stream_events(session, url, 10)
        await stream_events(session, url, n_tokens, delay=ITL_DELAY, gaps=gaps)
    gaps.sort()
    return {"p50_ms": 1000 * gaps[len(gaps) // 2], "p99_ms": 1000 * gaps[int(len(gaps) * 0.99)]}


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return sorted(runs, key=lambda r: r["req_s"])[len(runs) // 2]


def run(modes: list[tuple[str, bool]], duration: float, rounds: int, only: str) -> dict[str, dict[str, Any]]:
    """Every scenario runs ``rounds`` times, alternating the servers round by round so
    that load from elsewhere on the machine hits both alike; the median run is reported."""
    servers = {name: start_server(fast, name) for name, fast in modes}
    results: dict[str, dict[str, Any]] = {name: {} for name, _ in modes}
    raw, binary_headers = binary_unary()
    scenarios: list[tuple[str, int, bytes, dict[str, str]]] = [
        ("json c=1", 1, UNARY, {"Content-Type": "application/json"}),
        ("json c=16", 16, UNARY, {"Content-Type": "application/json"}),
        ("json c=64", 64, UNARY, {"Content-Type": "application/json"}),
        ("binary c=16", 16, raw, binary_headers),
    ]
    wanted = [w.strip() for w in only.split(",") if w.strip()]

    def chosen(key: str) -> bool:
        return not wanted or any(w in key for w in wanted)

    try:
        for key, concurrency, body, headers in scenarios:
            if not chosen(key):
                continue
            runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in modes}
            for _ in range(rounds):
                for name, _fast in modes:
                    process, url = servers[name]
                    cpu = server_cpu(process.pid)
                    stats = asyncio.run(unary(url, concurrency, duration, body, headers))
                    # the warm-up is inside the CPU window too: count its requests as well
                    stats["cpu_us"] = 1e6 * (server_cpu(process.pid) - cpu) / max(1.0, stats["served"])
                    runs[name].append(stats)
            for name, _ in modes:
                stats = results[name][key] = median_run(runs[name])
                each = ", ".join(f"{r['req_s']:.0f}" for r in runs[name])
                print(
                    f"[{name:5}] unary infer {key:<12} {stats['req_s']:7.0f} req/s   "
                    f"{stats['cpu_us']:5.0f} us CPU/req   p50 {stats['p50_ms']:6.2f} ms"
                    f"   p99 {stats['p99_ms']:6.2f} ms   errors {stats['errors']}   (runs: {each})",
                    flush=True,
                )
        sse_points = (
            ("sse 1 stream", 1, 10_000, "streamer"),
            ("sse 64 streams", 64, 1_000, "streamer"),
            ("sse batch 1 stream", 1, 10_000, "ticker"),
            ("sse batch 64 streams", 64, 1_000, "ticker"),
        )
        for key, concurrent, n_tokens, model in sse_points:
            if not chosen(key):
                continue
            rates: dict[str, list[float]] = {name: [] for name, _ in modes}
            cpus: dict[str, list[float]] = {name: [] for name, _ in modes}
            for _ in range(rounds):
                for name, _fast in modes:
                    process, url = servers[name]
                    cpu = server_cpu(process.pid)
                    rates[name].append(asyncio.run(streams(url, concurrent, n_tokens, model)))
                    cpus[name].append(1e6 * (server_cpu(process.pid) - cpu) / (concurrent * n_tokens + 10))
            for name, _ in modes:
                rate = results[name][key] = sorted(rates[name])[len(rates[name]) // 2]
                each = ", ".join(f"{r:.0f}" for r in rates[name])
                cpu_each = ", ".join(f"{c:.0f}" for c in cpus[name])
                print(
                    f"[{name:5}] {key} ({n_tokens} tokens each) {rate:8.0f} events/s   (runs: {each})"
                    f"   server CPU {min(cpus[name]):.0f} us/event (runs: {cpu_each})",
                    flush=True,
                )
        if chosen("itl c=1"):
            itls: dict[str, list[dict[str, float]]] = {name: [] for name, _ in modes}
            for _ in range(rounds):
                for name, _fast in modes:
                    itls[name].append(asyncio.run(inter_token_latency(servers[name][1])))
            for name, _ in modes:
                best = results[name]["itl c=1"] = min(itls[name], key=lambda r: r["p50_ms"])
                each = ", ".join(f"{r['p50_ms']:.2f}/{r['p99_ms']:.2f}" for r in itls[name])
                print(
                    f"[{name:5}] itl c=1 (paced {1000 * ITL_DELAY:.0f} ms)  p50 {best['p50_ms']:.2f} ms"
                    f"   p99 {best['p99_ms']:.2f} ms   (runs p50/p99: {each})",
                    flush=True,
                )
    finally:
        for process, _ in servers.values():
            assert process.stdin is not None
            process.stdin.close()
        for process, _ in servers.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per unary run (default 3)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs per scenario and server; the median is shown"
    )
    parser.add_argument("--mode", choices=("fast", "quart", "both"), default="both")
    parser.add_argument(
        "--only", default="", help="comma-separated parts of scenario names to run (default: all)"
    )
    parser.add_argument(
        "--baseline", metavar="CHECKOUT", help="also measure the actorserve of this checkout (fast path)"
    )
    parser.add_argument(
        "--otel", action="store_true", help="also measure this checkout with tracing on (spans discarded)"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-fast-path", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_forever(fast_path=not args.no_fast_path)
        return
    modes = [("fast", True), ("quart", False)] if args.mode == "both" else [(args.mode, args.mode == "fast")]
    if args.baseline:
        pythonpath = os.pathsep.join([os.path.abspath(args.baseline), os.environ.get("PYTHONPATH", "")])
        VARIANT_ENV["base"] = {"PYTHONPATH": pythonpath}
        modes.append(("base", True))
    if args.otel:
        VARIANT_ENV["otel"] = {"BENCH_OTEL": "1"}
        modes.append(("otel", True))
    summary = run(modes, args.duration, args.rounds, args.only)
    if "fast" in summary and "quart" in summary:
        for key in ("json c=1", "json c=16", "json c=64", "binary c=16"):
            if key not in summary["fast"]:
                continue
            fast, quart = summary["fast"][key]["req_s"], summary["quart"][key]["req_s"]
            print(f"{key:<12} fast path {fast:6.0f} req/s vs Quart {quart:6.0f} req/s ({fast / quart:.2f}x)")


if __name__ == "__main__":
    main()
