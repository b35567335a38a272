"""Disconnect storm: 1,000 SSE and 1,000 gRPC streams cut at random points: 0 leaked tasks, 0 batch slots held, 0 open requests; sequences reusable.

    python benchmarks/soak.py disconnects [--streams 1000] [--sequences 200] [--api-workers 2]

Each stream (half on the ``streamer``, half on the ``text`` BatchModel, so that cuts land
in running batches) is cut at a random point: half its request body sent, the request
sent and nothing read, or after some events. Meanwhile ``--sequences`` accumulator
sequences each have a request cut and must take their next one. Afterwards, read from
``GET /metrics``: requests in flight (transports and models), batch slots held and
waiting, and the trio tasks of every process against the baseline before the storm.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from functools import partial
from typing import Any

import trio

from ._common import Running, live_work, load, scrape, tasks

SETTLE = 30.0


async def settled_tasks(url: str, baseline: float) -> tuple[float, dict[str, float], float]:
    """(tasks, live work, seconds) once nothing is in flight and the task count is back at
    the baseline, or after SETTLE seconds."""
    start = time.monotonic()
    with trio.move_on_after(SETTLE):
        while True:
            samples = await scrape(url)
            if not live_work(samples) and tasks(samples) <= baseline:
                break
            await trio.sleep(0.5)
    samples = await scrape(url)
    return tasks(samples), live_work(samples), time.monotonic() - start


async def storm(server: Running, workers: int, args: argparse.Namespace) -> int:
    """One storm on ``server``; prints its row; 1 if something was left behind."""
    host, port = server.http
    await load.sse_storm(host, port, load.streamer_case(3), 6, seed=0)  # warm every path
    await load.in_asyncio_thread(partial(load.grpc_storm, *server.grpc, load.streamer_case(3), 6, 0))
    await load.cut_sequences(host, port, 3, f"warm{workers}")
    await trio.sleep(3)
    baseline = max([tasks(await scrape(server.url)) for _ in range(5)])
    half = args.streams // 2
    cuts: dict[str, Counter[str]] = {}
    sums: Counter[str] = Counter()
    start = time.monotonic()

    async def sse(name: str, case: Any, count: int) -> None:
        cuts[f"sse {name}"] = await load.sse_storm(host, port, case, count, seed=1)

    async def grpc(name: str, case: Any, count: int) -> None:
        cuts[f"grpc {name}"] = await load.in_asyncio_thread(
            partial(load.grpc_storm, *server.grpc, case, count, 2)
        )

    async def sequences() -> None:
        sums.update(await load.cut_sequences(host, port, args.sequences, f"cut{workers}"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sse, "streamer", load.streamer_case(20, delay=0.005), half)
        nursery.start_soon(sse, "text", load.text_case(20), args.streams - half)
        nursery.start_soon(grpc, "streamer", load.streamer_case(20, delay=0.005), half)
        nursery.start_soon(grpc, "text", load.text_case(20), args.streams - half)
        nursery.start_soon(sequences)
    storm = time.monotonic() - start
    after, left, took = await settled_tasks(server.url, baseline)
    where: Counter[str] = Counter()
    for counts in cuts.values():
        where.update(counts)
    sse_total = sum(sum(c.values()) for k, c in cuts.items() if k.startswith("sse"))
    grpc_total = sum(sum(c.values()) for k, c in cuts.items() if k.startswith("grpc"))
    bad = bool(left) or after > baseline
    print(
        f"| --api-workers {workers} | {sse_total} / {grpc_total} "
        f"| {where['body']} / {where['first']} / {where['mid']} / {where['done']} "
        f"| {sum(sums.values())} (sums {dict(sums)}) | {baseline:.0f} / {after:.0f} | {left or 0} "
        f"| {took:.1f} | {storm:.1f} |",
        flush=True,
    )
    return int(bad)


async def scenario(args: argparse.Namespace) -> int:
    failures = 0
    print(
        "| shape | streams cut (SSE / gRPC) | where (body / first / mid / finished first) | sequences cut, then reused "
        "| tasks before / after | in flight, slots after | settled in s | storm s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for workers in args.api_workers:
        with Running(workers) as server:
            failures += await storm(server, workers, args)
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py disconnects", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000, help="per transport (SSE, gRPC)")
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--api-workers", type=int, nargs="+", default=[2, 0])
    return trio.run(scenario, parser.parse_args(argv))
