"""Memory: 200,000 requests and 100,000 sequences opened and ended: RSS growth after the first 10,000 < 5 %.

    python benchmarks/soak.py memory [--requests 200000] [--sequences 100000] [--api-workers 2]

Unary ``streamer`` requests and one-request ``accumulator`` sequences (start and end in
one request), interleaved, over ``--connections`` kept-alive REST connections to
``python -m actorserve`` (its built-in models). The RSS of the whole server (every
process) is read after the first 10,000 calls and then every ``--every`` calls; at the end
the growth since the first reading, the sequences still open and the requests in flight.
"""

from __future__ import annotations

import argparse
import time

import trio

from ._common import Running, live_work, load, mib, scrape

FIRST = 10_000


async def scenario(args: argparse.Namespace) -> int:
    with Running(args.api_workers) as server:
        host, port = server.http
        total = args.requests + args.sequences
        # every k-th call is a sequence, spread evenly
        stride = total / max(1, args.sequences)
        tally = load.Tally()
        readings: list[tuple[int, int]] = []
        done = 0
        next_reading = FIRST
        plain, stateful = load.streamer_case(1), load.accumulator_case(f"mem{time.monotonic_ns()}")
        start = time.monotonic()

        async def worker(index: int) -> None:
            nonlocal done, next_reading
            conn = load.RestConn(host, port)
            try:
                for k in range(index, total, args.connections):
                    case = stateful if int(k % stride) == 0 else plain
                    tally.add(await load.rest_call(host, port, case, k, stream=False, conn=conn))
                    done += 1
                    if done >= next_reading:
                        next_reading += args.every
                        readings.append((done, load.tree_rss(server.pid)))
            finally:
                await conn.aclose()

        async with trio.open_nursery() as nursery:
            for index in range(args.connections):
                nursery.start_soon(worker, index)
        took = time.monotonic() - start
        await trio.sleep(2)
        readings.append((done, load.tree_rss(server.pid)))
        samples = await scrape(server.url)
        open_sequences = sum(v for (n, _), v in samples.items() if n == "actorserve_sequences_open")
        ended = sum(
            v
            for (n, labels), v in samples.items()
            if n == "actorserve_sequences_ended_total" and ("reason", "ended") in labels
        )
        first = readings[0][1]
        growth = readings[-1][1] / first - 1
        print(
            f"--api-workers {args.api_workers}: {tally.offered} calls in {took:.0f} s ({tally.offered / took:.0f}/s) "
            f"over {args.connections} connections"
        )
        print("| calls done | RSS MiB | vs the first 10,000 |")
        print("|---|---|---|")
        for count, rss in readings:
            print(f"| {count} | {mib(rss)} | {rss / first - 1:+.1%} |")
        print(
            f"answered {tally.ok} ok, {tally.rejected} 429, errors {dict(tally.errors)}, lost {dict(tally.lost)}; "
            f"sequences ended {ended:.0f}, still open {open_sequences:.0f}; in flight {live_work(samples) or 0}; "
            f"RSS growth after the first {FIRST:,}: {growth:+.1%}"
        )
        ok = growth < 0.05 and not tally.lost and not tally.errors and open_sequences == 0
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py memory", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--every", type=int, default=25_000)
    parser.add_argument("--api-workers", type=int, default=2)
    return trio.run(scenario, parser.parse_args(argv))
