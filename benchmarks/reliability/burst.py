"""RSS after a burst: 1,024 connections at once, then idle: the server's RSS back within 10 % of its level before.

    python benchmarks/soak.py burst [--connections 1024] [--rounds 3] [--api-workers 0 2]
        [--env MALLOC_ARENA_MAX=2]

``python -m actorserve`` with the ``streamer`` on 127.0.0.1; after one warm-up request and
``--idle`` s the RSS of every process (the baseline); then ``--connections`` clients
connect at once, each on its own connection with one SSE request (4 tokens 50 ms apart,
so that they are all open together), and the server idles again. One row per round and
shape: the answers, and the RSS of the whole server (every process) before the burst,
at its peak and 1 s and ``--idle`` s after the last answer, then each process's before
and after. ``--env NAME=VALUE`` (repeatable) goes into the server's environment
(``MALLOC_ARENA_MAX=2``, say).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import psutil
import trio

from ._common import Running, load, mib

STREAMER = {
    "name": "streamer",
    "implementation": "actorserve.models.streamer.StreamerModel",
    "max_pending": 4096,
}


def each_rss(pid: int) -> dict[int, int]:
    """RSS of ``pid`` and each descendant, by pid."""
    root = psutil.Process(pid)
    out = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            out[proc.pid] = proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return out


async def burst(server: Running, connections: int) -> load.Tally:
    """``connections`` SSE calls, each on a connection of its own, all started at once."""
    tally = load.Tally()
    case = load.streamer_case(4, delay=0.05)
    go = trio.Event()

    async def one(k: int) -> None:
        await go.wait()
        tally.add(await load.rest_call(*server.http, case, k, stream=True))

    async with trio.open_nursery() as nursery:
        for k in range(connections):
            nursery.start_soon(one, k)
        await trio.sleep(0.1)
        go.set()
    return tally


async def scenario(args: argparse.Namespace) -> int:
    for pair in args.env:
        name, _, value = pair.partition("=")
        os.environ[name] = value  # the server's processes inherit it
    folder = Path(tempfile.mkdtemp(prefix="burst-"))
    (folder / "streamer").mkdir()
    (folder / "streamer" / "model-settings.json").write_text(json.dumps(STREAMER))
    print(
        f"{args.connections} connections at once, {args.rounds} rounds, idle {args.idle:g} s; "
        f"environment: {' '.join(args.env) or '-'}"
    )
    print(
        "| shape | round | answered (ok / other) | server RSS before / peak / +1 s / +idle, MiB | after vs before "
        "| each process before → after, MiB |"
    )
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for workers in args.api_workers:
        with Running(workers, str(folder)) as server:
            await load.rest_call(*server.http, load.streamer_case(1), 0, stream=True)  # warm-up
            await trio.sleep(args.idle)
            baseline = load.tree_rss(server.pid)
            for round_ in range(1, args.rounds + 1):
                before = each_rss(server.pid)
                with load.RssSampler(server.pid, interval=0.05) as sampler:
                    started = time.monotonic()
                    tally = await burst(server, args.connections)
                    took = time.monotonic() - started
                await trio.sleep(1)
                soon = load.tree_rss(server.pid)
                await trio.sleep(max(0.0, args.idle - 1))
                after = each_rss(server.pid)
                total_before, total_after = sum(before.values()), sum(after.values())
                worst = max(worst, total_after / baseline - 1)
                others = tally.offered - tally.ok
                procs = ", ".join(f"{mib(before[p])} → {mib(after.get(p, 0))}" for p in sorted(before))
                print(
                    f"| --api-workers {workers} | {round_} | {tally.ok} / {others} in {took:.1f} s "
                    f"| {mib(total_before)} / {mib(sampler.peak)} / {mib(soon)} / {mib(total_after)} "
                    f"| {total_after / total_before - 1:+.1%} | {procs} |",
                    flush=True,
                )
            print(
                f"--api-workers {workers}: baseline (after a warm-up request) {mib(baseline)} MiB, "
                f"after {args.rounds} bursts {mib(load.tree_rss(server.pid))} MiB",
                flush=True,
            )
    print(f"the worst RSS after a burst vs the baseline: {worst:+.1%}")
    return 0 if worst <= 0.10 else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py burst", description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before reading RSS")
    parser.add_argument("--api-workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server's environment")
    return trio.run(scenario, parser.parse_args(argv))
