"""Overload: 10x the measured capacity on streamer, accumulator and text over REST, SSE and gRPC: lost = 0, duplicated = 0, RSS back.

    python benchmarks/soak.py overload [--seconds 60] [--factor 10] [--api-workers 2]
        [--models streamer,accumulator,text] [--transports rest,sse,grpc,grpc-stream]

For each model and transport: first the capacity (closed loop: CONCURRENCY callers back to
back for ``--capacity-seconds``; answered per second), then requests started at
``--factor`` times that rate for ``--seconds`` whatever the answers (open loop; at most
``--limit`` at once on the client, far past the server's queue bounds). One row per case:
offered, completed, 429 / RESOURCE_EXHAUSTED, errors by kind, lost, duplicated, p99 of the
completed, and the RSS of the whole server (every process) before, at its peak and after.
The server is ``python -m actorserve`` (its built-in models) on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio
from grpclib.client import Channel

from ._common import Running, load, mib, quiet

CONCURRENCY = 32
#: the server's bounds in this run (the built-in models, with max_pending 64 instead of
#: 1,024 so that the bound, not the shared CPU, is what overflows at a rate a Python
#: client on the same 2 cores can offer)
MAX_PENDING, MAX_SEQUENCES = 64, 256
MODELS = {
    "streamer": {"implementation": "actorserve.models.streamer.StreamerModel"},
    "accumulator": {"implementation": "actorserve.models.accumulator.AccumulatorModel",
                    "sequence": {"max_sequences": MAX_SEQUENCES}},
    "text": {"implementation": "actorserve.models.text.TextModel",
             "parameters": {"prefill_chunk": 32, "max_tokens_limit": 2048}},
}  # fmt: skip


def model_folder(names: list[str]) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="overload-"))
    for name in names:
        (folder / name).mkdir()
        settings = {"name": name, "max_pending": MAX_PENDING, **MODELS[name]}
        (folder / name / "model-settings.json").write_text(json.dumps(settings))
    return folder
CASES: dict[str, Callable[[str], load.Case]] = {
    "streamer": lambda tag: load.streamer_case(8),
    "accumulator": lambda tag: load.accumulator_case(tag),
    "text": lambda tag: load.text_case(8),
}


async def run_case(server: Running, case: load.Case, transport: str, seconds: float, rate: float | None,
                   limit: int) -> tuple[load.Tally, int, float]:  # fmt: skip
    """Closed loop (``rate`` None) or open loop; (tally, calls not started, seconds taken)."""
    start = time.monotonic()
    if transport in ("rest", "sse"):
        call: Callable[[int], Awaitable[load.Outcome]] = partial(load.rest_call, *server.http, case, stream=transport == "sse")
        if rate is None:
            return await load.closed_loop_trio(CONCURRENCY, seconds, call), 0, time.monotonic() - start
        tally, skipped = await load.open_loop_trio(rate, seconds, limit, call, on_time=True)
        return tally, skipped, time.monotonic() - start

    async def run() -> tuple[load.Tally, int]:
        channels = [Channel(*server.grpc) for _ in range(8)]
        try:
            def one(k: int) -> Awaitable[load.Outcome]:
                return load.grpc_call(channels[k % len(channels)], case, k, stream=transport == "grpc-stream")

            if rate is None:
                return await load.closed_loop_asyncio(CONCURRENCY, seconds, one), 0
            return await load.open_loop_asyncio(rate, seconds, limit, one, on_time=True)
        finally:
            for channel in channels:
                channel.close()

    tally, skipped = await load.in_asyncio_thread(run)
    return tally, skipped, time.monotonic() - start


def kinds(counter: dict[str, int]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in sorted(counter.items())) or "0"


async def scenario(args: argparse.Namespace) -> int:
    failures = 0
    folder = model_folder(args.models.split(","))
    with Running(args.api_workers, *args.server_args.split(), str(folder)) as server:
        await trio.sleep(2)
        baseline = load.tree_rss(server.pid)
        print(f"server: --api-workers {args.api_workers}, max_pending {MAX_PENDING}, RSS at start {mib(baseline)} MiB; "
              f"{args.factor}x capacity for {args.seconds:.0f} s per case, client bound {args.limit}", flush=True)  # fmt: skip
        print("| model | transport | capacity/s | offered (rate/s) | completed | 429 | errors | lost | duplicated "
              "| p99 s | RSS before / peak / after MiB |", flush=True)  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for model in args.models.split(","):
            for transport in args.transports.split(","):
                tag = f"{model}-{transport}-{time.monotonic_ns()}"
                cap, _, took = await run_case(server, CASES[model](tag + "-cap"), transport, args.capacity_seconds, None, 0)
                capacity = cap.ok / took
                await quiet(server.url)
                before = load.tree_rss(server.pid)
                rate = max(1.0, capacity * args.factor)
                with load.RssSampler(server.pid) as sampler:
                    tally, skipped, took = await run_case(server, CASES[model](tag), transport, args.seconds, rate, args.limit)
                    left = await quiet(server.url)
                await trio.sleep(2)
                after = load.tree_rss(server.pid)
                bad = bool(tally.lost or tally.duplicated or left or any(k[:1] == "5" for k in tally.errors))
                failures += bad
                print(f"| {model} | {transport} | {capacity:.0f} | {tally.offered} ({tally.offered / took:.0f}) "
                      f"| {tally.ok} | {tally.rejected} | {kinds(tally.errors)} | {kinds(tally.lost)} "
                      f"| {tally.duplicated} | {tally.p99():.2f} | {mib(before)} / {mib(sampler.peak)} / {mib(after)} |"
                      + (f" not started (the client behind or at its bound): {skipped}" if skipped else "")
                      + (f" LEFT IN FLIGHT {left}" if left else ""), flush=True)  # fmt: skip
        final = load.tree_rss(server.pid)
        grown = final / baseline - 1
        print(f"RSS of the server: {mib(baseline)} MiB at start, {mib(final)} MiB after every case ({grown:+.1%})")
        if server.server.process.poll() is not None:
            print("the server exited", file=sys.stderr)
            failures += 1
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py overload", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--capacity-seconds", type=float, default=5.0)
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--limit", type=int, default=1024, help="client-side calls at once")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--models", default="streamer,accumulator,text")
    parser.add_argument("--server-args", default="", help="more options of python -m actorserve")
    parser.add_argument("--transports", default="rest,sse,grpc,grpc-stream")
    return trio.run(scenario, parser.parse_args(argv))
