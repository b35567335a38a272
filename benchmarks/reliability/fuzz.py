"""Bad input at length: schemathesis, hypothesis and raw gRPC garbage with many examples, random seeds.

    python benchmarks/soak.py fuzz [--examples 40] [--codec-examples 3000] [--grpc-connections 2000]

One row per case:

- ``schemathesis``: every operation of the served OpenAPI document (valid cases, and
  invalid ones for every operation, path parameters included), against a real
  in-process server on 127.0.0.1 port 0 with both HTTP/1.1 parsers; counts requests
  sent, 5xx (besides the documented 501 of ``/explanations``), crashes (no HTTP answer)
  and 4xx answers that are not the route family's JSON error;
- ``hypothesis``: the properties of ``tests/reliability/test_rel_badinput_codecs.py``
  (codecs, SSE, link frames, protobuf) with ``--codec-examples`` each and random seeds;
- ``grpc-garbage``: connections to the gRPC port carrying random bytes after the HTTP/2
  preface, or calls with random message bytes; counts how each ended (a gRPC status,
  GOAWAY, close), unexpected exceptions (UNKNOWN, or "internal error: ..."; the 5xx column) and calls left without an answer
  (crashes column), with a good call after every 50 to show the server serves. Random
  bytes after the preface that start a frame and stop part way wait for its rest, as
  HTTP/2 allows (counted apart).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's package and test helpers

from support.grpcframes import frame
from support.rel_badinput import (
    good_grpc_call,
    grpc_headers,
    h2_client,
    h2_exchange,
    infer_message,
    launch,
)
from support.rel_schema import run_schema

from actorserve.transport.rest.openapi import openapi_document

ROW = "{:<26} {:>9} {:>6} {:>8} {:>13} {:>9} {:>8}"


def header() -> None:
    print(ROW.format("case", "requests", "5xx", "crashes", "non-JSON 4xx", "problems", "seconds"))


async def schemathesis_rows(examples: int) -> int:
    failed = 0
    document = openapi_document()
    for parser in ("httptools", "h11"):
        async with trio.open_nursery() as nursery:
            server = await launch(nursery, grpc_port=None, http_parser=parser)
            management = server.extra_addresses["ts_management_http"]
            started = time.monotonic()
            tally = await trio.to_thread.run_sync(
                lambda server=server, management=management: run_schema(
                    document,
                    server.http_url or "",
                    examples=examples,
                    seed=None,
                    negative_everywhere=True,
                    management_url=f"http://127.0.0.1:{management[1]}",
                )
            )
            problems = [
                p for p in tally.problems if not (400 <= p[1] < 500 and p[2].startswith("not a JSON"))
            ]
            print(
                ROW.format(
                    f"schemathesis {parser}",
                    tally.sent,
                    tally.server_errors,
                    len(tally.crashes),
                    tally.non_json_4xx,
                    len(problems),
                    f"{time.monotonic() - started:.0f}",
                )
            )
            for what in (*tally.problems[:10], *tally.crashes[:10]):
                print("   ", what)
            print(
                f"    statuses: {dict(sorted(tally.statuses.items()))}; 501 on /explanations: {tally.not_implemented}"
            )
            failed += bool(tally.server_errors or tally.crashes or tally.problems)
            nursery.cancel_scope.cancel()
    return failed


def hypothesis_row(examples: int) -> int:
    started = time.monotonic()
    env = {**os.environ, "ACTORSERVE_FUZZ_EXAMPLES": str(examples), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/reliability/test_rel_badinput_codecs.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-300:]
    print(
        ROW.format(
            "hypothesis (codecs)",
            f"{examples}/prop",
            "-",
            "-",
            "-",
            int(result.returncode != 0),
            f"{time.monotonic() - started:.0f}",
        )
    )
    print(f"    {summary}")
    if result.returncode != 0:
        print(result.stdout[-3000:])
    return int(result.returncode != 0)


async def grpc_garbage_row(connections: int, seed: int) -> int:
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    hangs = good = 0
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        server = await launch(nursery, http_port=None, ts_management_http_port=None)
        assert server.grpc_address is not None
        port = server.grpc_address[1]
        valid = infer_message()
        for k in range(connections):
            conn = h2_client()
            kind = rng.choice(
                ["bytes after the preface", "random message", "mutated message", "random prefix"]
            )
            raw = b""
            if kind == "bytes after the preface":
                raw = rng.randbytes(rng.randint(1, 200))
            else:
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, grpc_headers(port))
                if kind == "random message":
                    body = frame(rng.randbytes(rng.randint(0, 120)))
                elif kind == "mutated message":
                    data = bytearray(valid)
                    for _ in range(rng.randint(1, 4)):
                        data[rng.randrange(len(data))] = rng.randrange(256)
                    body = frame(bytes(data))
                else:
                    body = rng.randbytes(rng.randint(0, 12))
                conn.send_data(sid, body, end_stream=True)
            try:  # a partial frame is given 2 s to be refused or go on waiting
                with trio.fail_after(2 if kind == "bytes after the preface" else 10):
                    out = await h2_exchange(port, conn, raw)
            except trio.TooSlowError:
                # a partial frame waits for its rest, as HTTP/2 allows: not an answer, not a hang
                outcomes["waiting for the rest of a frame"] += 1 if kind == "bytes after the preface" else 0
                hangs += kind != "bytes after the preface"
                continue
            if out.grpc_message.startswith("internal error:"):  # an unexpected exception: a bug
                outcomes[f"internal error ({out.grpc_message})"] += 1
            elif out.grpc_status is not None:
                outcomes[f"grpc-status {out.grpc_status}"] += 1
            elif out.goaway is not None:
                outcomes[f"GOAWAY {out.goaway}"] += 1
            elif out.closed:
                outcomes["closed"] += 1
            else:
                outcomes["other"] += 1
            if k % 50 == 49:
                good += await good_grpc_call(port, value=k) == [k]
        nursery.cancel_scope.cancel()
    # UNKNOWN (grpclib's answer to an exception it did not expect) or actorserve's
    # "internal error: <exception>": an exception nobody expected, gRPC's 5xx
    unknown = outcomes.get("grpc-status 2", 0) + sum(
        n for k, n in outcomes.items() if k.startswith("internal error")
    )
    print(
        ROW.format(
            "grpc-garbage",
            connections,
            unknown,
            hangs,
            "-",
            outcomes.get("other", 0),
            f"{time.monotonic() - started:.0f}",
        )
    )
    print(
        f"    outcomes: {dict(sorted(outcomes.items()))}; good calls in between: {good}/{connections // 50}"
    )
    return int(hangs > 0 or unknown > 0 or outcomes.get("other", 0) > 0 or good != connections // 50)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40, help="schemathesis cases per operation and mode")
    parser.add_argument(
        "--codec-examples", type=int, default=3000, help="hypothesis examples per codec property"
    )
    parser.add_argument(
        "--grpc-connections", type=int, default=2000, help="garbage connections to the gRPC port"
    )
    parser.add_argument("--seed", type=int, default=int(time.time()), help="seed of the gRPC garbage")
    parser.add_argument("--only", choices=["schemathesis", "hypothesis", "grpc"], help="run one case")
    args = parser.parse_args(argv)
    print(f"fuzz: seed {args.seed}")
    header()
    failed = 0
    if args.only in (None, "schemathesis"):
        failed += trio.run(schemathesis_rows, args.examples)
    if args.only in (None, "grpc"):
        failed += trio.run(grpc_garbage_row, args.grpc_connections, args.seed)
    if args.only in (None, "hypothesis"):
        failed += hypothesis_row(args.codec_examples)
    print("fuzz: " + ("every case held" if not failed else f"{failed} case(s) broke the rules"))
    return 1 if failed else 0
