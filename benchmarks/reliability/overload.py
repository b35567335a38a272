"""Overload: 10x the measured capacity on streamer, accumulator and text over REST, SSE and gRPC: lost = 0, duplicated = 0, RSS back.

    python benchmarks/soak.py overload [--seconds 60] [--factor 10] [--api-workers 2]
        [--models streamer,accumulator,text] [--transports rest,sse,grpc,grpc-stream]
        [--paced | --unpaced]

For each model and transport: first the capacity (closed loop: as many callers as the
model's bound admits, back to back for ``--capacity-seconds``; answered per second), then
requests started at ``--factor`` times that rate for ``--seconds`` whatever the answers
(open loop; at most ``--limit`` at once on the client, far past the server's bounds). One
row per case: the capacity, the rate asked and the rate this client really started (a
case below 9x is marked ``BELOW 9x``), completed, 429 / RESOURCE_EXHAUSTED, errors by
kind, lost, duplicated, p99 of the completed, and the RSS of the whole server (every
process) before, at its peak and after (each read after ``--idle`` s with nothing in
flight). The baseline is the RSS after one warm-up request per model.

The server is ``python -m actorserve`` on 127.0.0.1 with the models of :data:`PACED`
(default: capacities of ~20-40 calls/s, so that 10x is within what a Python client on
the same 2 cores can start) or :data:`UNPACED` (the built-in models as they are).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from grpclib.client import Channel

from ._common import Running, load, mib, quiet

HERE = Path(__file__).resolve().parent


@attrs.frozen
class Shape:
    """A model as the soak serves it: its model-settings.json (less the name), the files
    its folder holds besides, what a call sends, and how many callers measure capacity."""

    settings: dict[str, Any]
    case: Callable[[str], load.Case]
    concurrency: int
    files: dict[str, Path] = attrs.field(factory=dict)


#: ``--paced`` (the default): each model's capacity is set by its bounds and a delay, at
#: ~20-40 calls a second, so that 10x of it (200-400/s) is within what a Python client on
#: the same 2 cores starts; capacity is measured with as many callers as the bound admits.
#: streamer: 8 at once (max_pending), 4 tokens 80 ms apart (~25/s); accumulator: batches
#: of 2 held 80 ms each, 8 sequences open at once (~25/s); text: batches of 2, 8 waiting,
#: 64 tokens a call (CPU-bound, measured).
PACED = {
    "streamer": Shape(
        {"implementation": "actorserve.models.streamer.StreamerModel", "max_pending": 8},
        lambda tag: load.streamer_case(4, delay=0.08),
        8,
    ),
    "accumulator": Shape(
        {
            "implementation": "paced_accumulator.PacedAccumulator",
            "max_batch_size": 2,
            "parameters": {"step_delay": 0.08},
            "sequence": {"max_sequences": 8},
        },
        lambda tag: load.accumulator_case(tag),
        8,
        {"paced_accumulator.py": HERE / "_paced_accumulator.py"},
    ),
    "text": Shape(
        {
            "implementation": "actorserve.models.text.TextModel",
            "max_batch_size": 2,
            "max_pending": 8,
            "parameters": {"prefill_chunk": 32, "max_tokens_limit": 2048},
        },
        lambda tag: load.text_case(64),
        8,
    ),
}
#: ``--unpaced``: the built-in models as they are, with max_pending 64 instead of 1,024
#: (and max_sequences 256); their capacity (60-410 calls/s) times 10 is past what this
#: client can start, so the client, not the server, sets the pace (the first run's table)
UNPACED = {
    "streamer": Shape(
        {"implementation": "actorserve.models.streamer.StreamerModel", "max_pending": 64},
        lambda tag: load.streamer_case(8),
        32,
    ),
    "accumulator": Shape(
        {
            "implementation": "actorserve.models.accumulator.AccumulatorModel",
            "max_pending": 64,
            "sequence": {"max_sequences": 256},
        },
        lambda tag: load.accumulator_case(tag),
        32,
    ),
    "text": Shape(
        {
            "implementation": "actorserve.models.text.TextModel",
            "max_pending": 64,
            "parameters": {"prefill_chunk": 32, "max_tokens_limit": 2048},
        },
        lambda tag: load.text_case(8),
        32,
    ),
}


def model_folder(shapes: dict[str, Shape], names: list[str]) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="overload-"))
    for name in names:
        (folder / name).mkdir()
        (folder / name / "model-settings.json").write_text(
            json.dumps({"name": name, **shapes[name].settings})
        )
        for file, source in shapes[name].files.items():
            shutil.copy(source, folder / name / file)
    return folder


async def run_case(
    server: Running,
    case: load.Case,
    transport: str,
    seconds: float,
    rate: float | None,
    limit: int,
    concurrency: int = 32,
) -> tuple[load.Tally, int, float]:
    """Closed loop (``rate`` None) or open loop; (tally, calls not started, seconds taken)."""
    start = time.monotonic()
    if transport in ("rest", "sse"):
        call: Callable[[int], Awaitable[load.Outcome]] = partial(
            load.rest_call, *server.http, case, stream=transport == "sse"
        )
        if rate is None:
            return await load.closed_loop_trio(concurrency, seconds, call), 0, time.monotonic() - start
        tally, skipped = await load.open_loop_trio(rate, seconds, limit, call, on_time=True)
        return tally, skipped, time.monotonic() - start

    async def run() -> tuple[load.Tally, int]:
        channels = [Channel(*server.grpc) for _ in range(8)]
        try:

            def one(k: int) -> Awaitable[load.Outcome]:
                return load.grpc_call(channels[k % len(channels)], case, k, stream=transport == "grpc-stream")

            if rate is None:
                return await load.closed_loop_asyncio(concurrency, seconds, one), 0
            return await load.open_loop_asyncio(rate, seconds, limit, one, on_time=True)
        finally:
            for channel in channels:
                channel.close()

    tally, skipped = await load.in_asyncio_thread(run)
    return tally, skipped, time.monotonic() - start


def kinds(counter: dict[str, int]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in sorted(counter.items())) or "0"


async def warm_up(server: Running, shapes: dict[str, Shape], models: list[str]) -> None:
    """One request per model (REST), so that the baseline RSS is the server's after its
    first request, not before (lazy imports, first buffers)."""
    for model in models:
        outcome = await load.rest_call(*server.http, shapes[model].case(f"warm-{model}"), 0, stream=False)
        if outcome.kind != "ok":
            raise RuntimeError(f"the warm-up request to {model} failed: {outcome}")


async def scenario(args: argparse.Namespace) -> int:
    failures = 0
    models = args.models.split(",")
    shapes = UNPACED if args.unpaced else PACED
    folder = model_folder(shapes, models)
    with Running(args.api_workers, *args.server_args.split(), str(folder)) as server:
        await warm_up(server, shapes, models)
        await trio.sleep(3)  # idle: the warm-up's memory settles (and is trimmed)
        baseline = load.tree_rss(server.pid)
        print(
            f"server: --api-workers {args.api_workers}, {'unpaced' if args.unpaced else 'paced'} models "
            f"({', '.join(f'{m}: {json.dumps(shapes[m].settings)}' for m in models)}); RSS after a warm-up request "
            f"{mib(baseline)} MiB; {args.factor:g}x capacity for {args.seconds:.0f} s per case, client bound {args.limit}",
            flush=True,
        )
        print(
            "| model | transport | capacity/s | asked/s | offered (started/s, x capacity) | completed | 429 | errors "
            "| lost | duplicated | p99 s | RSS before / peak / after MiB |",
            flush=True,
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for model in models:
            shape = shapes[model]
            for transport in args.transports.split(","):
                tag = f"{model}-{transport}-{time.monotonic_ns()}"
                cap, _, took = await run_case(
                    server,
                    shape.case(tag + "-cap"),
                    transport,
                    args.capacity_seconds,
                    None,
                    0,
                    shape.concurrency,
                )
                capacity = cap.ok / took
                await quiet(server.url)
                await trio.sleep(args.idle)
                before = load.tree_rss(server.pid)
                rate = max(1.0, capacity * args.factor)
                with load.RssSampler(server.pid) as sampler:
                    tally, skipped, took = await run_case(
                        server, shape.case(tag), transport, args.seconds, rate, args.limit
                    )
                    left = await quiet(server.url)
                await trio.sleep(args.idle)
                after = load.tree_rss(server.pid)
                offered_rate = tally.offered / args.seconds
                achieved = offered_rate / capacity if capacity else 0.0
                bad = bool(tally.lost or tally.duplicated or left or any(k[:1] == "5" for k in tally.errors))
                failures += bad
                print(
                    f"| {model} | {transport} | {capacity:.0f} | {rate:.0f} | {tally.offered} ({offered_rate:.0f}, "
                    f"{achieved:.1f}x){'' if achieved >= 0.9 * args.factor else ' BELOW 9x'} "
                    f"| {tally.ok} | {tally.rejected} | {kinds(tally.errors)} | {kinds(tally.lost)} "
                    f"| {tally.duplicated} | {tally.p99():.2f} | {mib(before)} / {mib(sampler.peak)} / {mib(after)} |"
                    + (f" not started (the client behind or at its bound): {skipped}" if skipped else "")
                    + (f" LEFT IN FLIGHT {left}" if left else ""),
                    flush=True,
                )
        final = load.tree_rss(server.pid)
        grown = final / baseline - 1
        print(
            f"RSS of the server: {mib(baseline)} MiB after a warm-up request, {mib(final)} MiB after every case "
            f"({grown:+.1%}{'' if grown <= 0.10 else ', MORE THAN 10 %'})"
        )
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
    parser.add_argument(
        "--idle", type=float, default=3.0, help="seconds idle before reading RSS before and after a case"
    )
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--paced", dest="unpaced", action="store_false", help="small paced capacities (default)"
    )
    pace.add_argument(
        "--unpaced", dest="unpaced", action="store_true", help="the built-in models as they are"
    )
    parser.set_defaults(unpaced=False)
    return trio.run(scenario, parser.parse_args(argv))
