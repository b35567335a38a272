"""REST throughput and latency (prints numbers; not a test).

    python benchmarks/rest.py [--duration 5] [--mode fast|quart|both]

Starts actorserve (built-in models) in a subprocess on 127.0.0.1 with a free port, then
measures from this process with aiohttp (keep-alive connections):

- unary ``infer`` on ``identity`` (JSON, 16 FP32 values): req/s, p50 and p99 latency at
  concurrency 1, 16 and 64 (and one binary-tensor run at 16);
- SSE events/s of one ``infer_stream`` of the ``streamer`` with n_tokens=10000;
- tokens/s of 64 concurrent streams.

``--mode`` picks the front door for ``infer``: the raw-ASGI fast path, Quart, or both.
Every phase is bounded by ``--duration`` seconds (the streams by their token count).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

UNARY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [float(i) for i in range(16)]}]}
).encode()


def binary_unary() -> tuple[bytes, dict[str, str]]:
    import numpy as np

    head = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return head + np.arange(16, dtype=np.float32).tobytes(), {"Inference-Header-Content-Length": str(len(head))}


# -- the server side (a child process) ---------------------------------------------------


def serve_forever(fast_path: bool) -> None:
    import trio

    import actorserve
    from actorserve.server import serve
    from actorserve.settings import builtin_models

    async def main() -> None:
        settings = actorserve.Settings(
            models=tuple(builtin_models()), host="127.0.0.1", http_port=0, grpc_port=None, grace_period=1.0
        )
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve, settings, rest_fast_path=fast_path))
            print(server.http_url, flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
            server.shutdown()

    trio.run(main)


def start_server(fast_path: bool) -> tuple[subprocess.Popen[str], str]:
    args = [sys.executable, __file__, "--serve"] + ([] if fast_path else ["--no-fast-path"])
    process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        process.kill()
        raise SystemExit(f"the server did not start (got {url!r})")
    return process, url


# -- the client side ---------------------------------------------------------------------


async def unary(url: str, concurrency: int, duration: float, body: bytes, headers: dict[str, str]) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        target = f"{url}/v2/models/identity/infer"
        warmup_end = time.perf_counter() + min(1.0, duration / 4)
        end = warmup_end + duration

        async def worker() -> None:
            nonlocal errors
            while (start := time.perf_counter()) < end:
                async with session.post(target, data=body, headers=headers) as reply:
                    await reply.read()
                    ok = reply.status == 200
                now = time.perf_counter()
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
    }


async def stream_events(session: Any, url: str, n_tokens: int) -> int:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["t"]}],
        "parameters": {"n_tokens": n_tokens},
    }
    count = 0
    async with session.post(f"{url}/v2/models/streamer/infer_stream", json=body) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if line.startswith(b"data: "):
                count += 1
    assert count == n_tokens, (count, n_tokens)
    return count


async def streams(url: str, concurrent: int, n_tokens: int) -> float:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrent), timeout=timeout) as session:
        await stream_events(session, url, 10)  # warm up
        start = time.perf_counter()
        counts = await asyncio.gather(*(stream_events(session, url, n_tokens) for _ in range(concurrent)))
        elapsed = time.perf_counter() - start
    return sum(counts) / elapsed


def run_mode(name: str, fast_path: bool, duration: float) -> dict[str, Any]:
    process, url = start_server(fast_path)
    results: dict[str, Any] = {}
    try:
        for concurrency in (1, 16, 64):
            stats = asyncio.run(unary(url, concurrency, duration, UNARY, {"Content-Type": "application/json"}))
            results[f"json c={concurrency}"] = stats
            print(f"[{name}] unary infer JSON   c={concurrency:<3} {stats['req_s']:8.0f} req/s   "
                  f"p50 {stats['p50_ms']:6.2f} ms   p99 {stats['p99_ms']:6.2f} ms   errors {stats['errors']}",
                  flush=True)  # fmt: skip
        raw, headers = binary_unary()
        stats = asyncio.run(unary(url, 16, duration, raw, headers))
        results["binary c=16"] = stats
        print(f"[{name}] unary infer binary c=16  {stats['req_s']:8.0f} req/s   "
              f"p50 {stats['p50_ms']:6.2f} ms   p99 {stats['p99_ms']:6.2f} ms   errors {stats['errors']}", flush=True)
        one = asyncio.run(streams(url, 1, 10_000))
        results["sse one stream events/s"] = one
        print(f"[{name}] SSE one stream (10000 tokens)      {one:8.0f} events/s", flush=True)
        many = asyncio.run(streams(url, 64, 1_000))
        results["sse 64 streams tokens/s"] = many
        print(f"[{name}] SSE 64 streams (1000 tokens each)  {many:8.0f} tokens/s", flush=True)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per unary measurement (default 5)")
    parser.add_argument("--mode", choices=("fast", "quart", "both"), default="both")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-fast-path", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_forever(fast_path=not args.no_fast_path)
        return
    modes = [("fast", True), ("quart", False)] if args.mode == "both" else [(args.mode, args.mode == "fast")]
    summary = {name: run_mode(name, fast, args.duration) for name, fast in modes}
    if len(summary) == 2:
        for key in ("json c=1", "json c=16", "json c=64", "binary c=16"):
            fast, quart = summary["fast"][key]["req_s"], summary["quart"][key]["req_s"]
            print(f"{key:<12} fast path {fast:6.0f} req/s vs Quart {quart:6.0f} req/s ({fast / quart:.2f}x)")


if __name__ == "__main__":
    main()
