"""Process faults with --api-workers 2: kill -9 a front under load (only its streams are cut, it is restarted and serves, no work left in the engine), then kill -9 the engine (exit 1 with a clear line, no client hangs).

    python benchmarks/soak.py process_faults [--rounds 3] [--streams 20]

Each round starts a server with two fronts, runs ``--streams`` SSE streams of
``streamer`` (300 tokens, 10 ms apart) on new connections, kills (SIGKILL) the front
holding the most of them, and reports: streams cut / complete (cut must equal the
victim's), seconds from the kill until the new front is ready, requests the new front
served alone (the other front paused) and ``/metrics`` there, and the engine's running
and waiting requests afterwards (TorchServe's describe-model). Then, with new streams
running, it kills the engine and reports the parent's exit code, seconds from the kill
to its exit, whether the log names the engine, and the streams that ended with an error
event, were cut, or hung (still open 30 s later).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from typing import Any

import httpx
from support.rel_process import established_connections, start_streams

from ._subprocess_server import Served


def _held(served: Served, count: int) -> dict[int, int]:
    deadline = time.monotonic() + 20
    while True:
        held = {i: established_connections(pid, served.http_port) for i, pid in served.fronts().items()}
        if sum(held.values()) >= count or time.monotonic() > deadline:
            return held
        time.sleep(0.02)


def front_round(served: Served, streams: int) -> dict[str, Any]:
    fronts = served.fronts()
    boxes, threads = start_streams(served.url, streams, 300, 0.01, daemon=True)
    held = _held(served, streams)
    victim = max(held, key=lambda i: held[i])
    survivor = next(i for i in fronts if i != victim)
    killed = time.monotonic()
    os.kill(fronts[victim], signal.SIGKILL)
    served.wait_for(rf"front {victim} process started \(pid (?!{fronts[victim]}\b)\d+\)", 60)
    restart = time.monotonic() - killed
    for thread in threads:
        thread.join(timeout=60)
    result: dict[str, Any] = {
        "held by victim": held[victim],
        "cut": sum(1 for b in boxes if "error" in b),
        "complete": sum(1 for b in boxes if "error" not in b and len(b["lines"]) == 300),
        "restart s": restart,
    }
    os.kill(served.fronts()[survivor], signal.SIGSTOP)
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            result["new front served"] = sum(
                client.post("/v2/models/streamer/generate", json={"text_input": "r"}).status_code == 200
                for _ in range(20)
            )
            result["metrics"] = client.get("/metrics").status_code
    finally:
        os.kill(served.fronts()[survivor], signal.SIGCONT)
    time.sleep(1.0)
    workers = httpx.get(f"{served.url}/models/streamer", timeout=10).json()[0]["workers"]
    result["engine running/waiting"] = "/".join(
        str(sum(w[k] for w in workers)) for k in ("running", "waiting")
    )
    return result


def engine_round(served: Served, streams: int) -> dict[str, Any]:
    boxes, threads = start_streams(served.url, streams, 10_000, 0.01, daemon=True)
    _held(served, streams)
    time.sleep(0.2)
    engine = served.engine_pid()
    killed = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    code = served.process.wait(timeout=60)
    took = time.monotonic() - killed
    for thread in threads:
        thread.join(timeout=30)
    named = re.search(
        rf"the engine process \(pid {engine}\) exited with code -9: stopping the server", served.text()
    )
    return {
        "exit code": code,
        "kill to exit s": took,
        "log names the engine": bool(named),
        "error event": sum(1 for b in boxes if "error" not in b and "event: error" in b["lines"][-2:]),
        "cut": sum(1 for b in boxes if "error" in b),
        "hung": sum(t.is_alive() for t in threads),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py process_faults", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=20)
    args = parser.parse_args(argv)
    failed = False
    print(
        "| round | streams (victim held) | cut | complete | restart (s) | new front served | /metrics "
        "| engine running/waiting | engine kill: exit code | kill to exit (s) | log names it | error event / cut / hung |"
    )
    print("|---" * 12 + "|")
    for round_ in range(1, args.rounds + 1):
        served = Served(2)
        try:
            f = front_round(served, args.streams)
            e = engine_round(served, args.streams)
        finally:
            served.stop()
        print(
            f"| {round_} | {args.streams} ({f['held by victim']}) | {f['cut']} | {f['complete']} | {f['restart s']:.2f} "
            f"| {f['new front served']}/20 | {f['metrics']} | {f['engine running/waiting']} | {e['exit code']} "
            f"| {e['kill to exit s']:.2f} | {'yes' if e['log names the engine'] else 'no'} "
            f"| {e['error event']} / {e['cut']} / {e['hung']} |",
            flush=True,
        )
        failed |= (
            f["cut"] != f["held by victim"]
            or f["complete"] != args.streams - f["held by victim"]
            or f["new front served"] != 20
            or f["engine running/waiting"] != "0/0"
            or e["exit code"] != 1
            or e["hung"] > 0
            or not e["log names the engine"]
        )
    return 1 if failed else 0
