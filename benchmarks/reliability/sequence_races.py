"""Sequence races against a real server: random start/end/cancel/idle timing, every answer final, every hook once.

    python benchmarks/soak.py sequence_races [--sequences 3000] [--clients 48]
        [--api-workers 0,2] [--seconds 300] [--unloads 3] [--seed 1]

Starts ``python -m actorserve`` on 127.0.0.1 (port 0) with the ``seqcount`` model
(``sequence_models/seqcount``: a stateful streaming BatchModel stepped in its thread,
which counts its own hook calls) and ``--clients`` concurrent clients, each running
sequences one after another until ``--sequences`` have been started. A sequence:
a start (sometimes with a server-made id), 1-6 requests (JSON, SSE streams, streams the
client cuts after a few events, two requests at once so one waits in the mailbox) with
random gaps (some just under the idle timeout, some past it), then an end, a cancel, an
end and a cancel sent at once, a double cancel, or nothing (it expires); small
``max_sequences`` makes starts evict. ``--unloads`` times during the run the model is
unloaded and loaded again under that traffic.

One row per ``--api-workers`` value: requests and how they ended, ``lost`` (no final
answer: a transport error, a 5xx, an SSE stream cut without its last event or an
``event: error``), ``state`` (a sequence's running total that went backwards or
repeated), hooks run twice, sequences whose state was never ended, batch slots held
after the run, the open-sequences gauge, and the server's RSS before and after.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL = HERE / "sequence_models" / "seqcount"
IDLE_MS = 1000
URL = "/v2/models/seqcount/infer"

#: answers that are final and say why (anything else is "other": lost)
KNOWN = [
    ("expired", re.compile(r"404 sequence '[^']+' expired")),
    ("cancelled", re.compile(r"404 sequence '[^']+' was cancelled")),
    ("evicted", re.compile(r"404 sequence '[^']+' was evicted \(max_sequences reached\)")),
    ("ended", re.compile(r"404 sequence '[^']+' has ended")),
    ("shut down", re.compile(r"404 sequence '[^']+' was shut down")),
    (
        "not open",
        re.compile(r"404 sequence '[^']+' is not open \(unknown id; start it with sequence_start\)"),
    ),
    ("409 open", re.compile(r"409 sequence '[^']+' is already open")),
    ("429", re.compile(r"429 .*(max_sequences|max_queue|max_pending)")),
    (
        "unloading",
        re.compile(r"(503|404) model 'seqcount'.*(shutting down|not loaded|not ready|loading|unloaded)"),
    ),
]


class Server:
    """``python -m actorserve`` in a subprocess; its log read by a thread."""

    def __init__(self, repo: Path, api_workers: int) -> None:
        args = [
            sys.executable,
            "-m",
            "actorserve",
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "off",
            "--no-auth",
            "--grace-period",
            "0.5",
            "--api-workers",
            str(api_workers),
            str(repo),
        ]
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.log: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.decode(errors="replace").rstrip())

    def url(self) -> str:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for line in list(self.log):
                match = re.search(r"REST listening on (http://\S+)", line)
                if match:
                    return match[1]
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit("the server did not start:\n" + "\n".join(self.log[-30:]))

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


class Run:
    """The clients of one row and what they saw."""

    def __init__(self, url: str, args: argparse.Namespace, rng: random.Random) -> None:
        self.url = url
        self.args = args
        self.rng = rng
        self.outcomes: Counter[str] = Counter()
        self.others: Counter[str] = Counter()
        self.started = 0
        self.requests = 0
        self.state_errors = 0
        self.client = httpx.AsyncClient(
            base_url=url, timeout=30, limits=httpx.Limits(max_connections=4 * args.clients)
        )

    def note(self, text: str) -> None:
        for kind, pattern in KNOWN:
            if pattern.fullmatch(text):
                self.outcomes[kind] += 1
                return
        self.outcomes["other (lost)"] += 1
        self.others[re.sub(r"'[^']+'", "'…'", text)[:160]] += 1

    async def send(self, parameters: dict[str, Any], n_tokens: int, mode: str, seen: list[int]) -> str | None:
        """One request; returns the sequence id on success. ``mode``: json, sse, cut."""
        self.requests += 1
        body = {"inputs": [], "parameters": {"n_tokens": n_tokens, **parameters}}
        try:
            if mode == "json":
                reply = await self.client.post(URL, json=body)
                doc = reply.json()
                if reply.status_code == 200:
                    self.outcomes["ok"] += 1
                    if "total" in [o["name"] for o in doc["outputs"]]:
                        seen.extend(doc["outputs"][0]["data"])
                    sid: str | None = doc["parameters"].get("sequence_id")
                    return sid
                self.note(f"{reply.status_code} {doc.get('error')}")
                return None
            return await self._stream(body, n_tokens, mode, seen)
        except (httpx.HTTPError, ValueError) as exc:
            self.note(f"transport {type(exc).__name__}: {exc}")
            return None

    async def _stream(self, body: dict[str, Any], n_tokens: int, mode: str, seen: list[int]) -> str | None:
        cut_after = self.rng.randint(1, 3) if mode == "cut" else None
        async with self.client.stream("POST", f"{URL}_stream", json=body) as reply:
            if reply.status_code != 200:
                await reply.aread()
                self.note(f"{reply.status_code} {reply.json().get('error')}")
                return None
            sid = reply.headers.get("sequence-id")
            kind, count = "data", 0
            async for line in reply.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    doc = json.loads(line[6:])
                    if kind == "error":
                        self.note(
                            f"404 {doc['error']}" if "sequence" in doc["error"] else f"503 {doc['error']}"
                        )
                        return None
                    seen.extend(doc["outputs"][0]["data"])
                    count += 1
                    if cut_after is not None and count >= cut_after:
                        self.outcomes["cut by client"] += 1
                        return sid
        if count == n_tokens:
            self.outcomes["ok"] += 1
            return sid
        self.note(f"sse stream ended after {count} of {n_tokens} events without an error event")
        return None

    async def worker(self, index: int) -> None:
        rng = random.Random(self.rng.random())
        while self.started < self.args.sequences and trio.current_time() < self.deadline:
            self.started += 1
            await self.sequence(rng, f"w{index}-{self.started}")

    async def sequence(self, rng: random.Random, name: str) -> None:
        seen: list[int] = []
        made = rng.random() < 0.1
        start: dict[str, Any] = (
            {"sequence_start": True} if made else {"sequence_id": name, "sequence_start": True}
        )
        sid = await self.send(start, rng.randint(0, 3), rng.choice(["json", "sse"]), seen)
        if sid is None:
            return
        for _ in range(rng.randint(1, 6)):
            gap = rng.choices(
                [0, 0.005, 0.05, IDLE_MS * 0.0008, IDLE_MS * 0.0014], weights=[4, 4, 3, 1, 0.4]
            )[0]
            await trio.sleep(gap)
            if rng.random() < 0.15:  # two at once: one waits in the mailbox
                async with trio.open_nursery() as nursery:
                    for _ in range(2):
                        nursery.start_soon(self.send, {"sequence_id": sid}, rng.randint(1, 4), "json", [])
                continue
            mode = rng.choices(["json", "sse", "cut"], weights=[5, 4, 1])[0]
            await self.send({"sequence_id": sid}, rng.randint(1, 12), mode, seen)
        self.state_errors += sum(1 for a, b in itertools.pairwise(seen) if b <= a)
        ending = rng.choices(["end", "cancel", "race", "double", "abandon"], weights=[4, 2, 1.5, 1, 1.5])[0]
        if ending == "end":
            await self.send({"sequence_id": sid, "sequence_end": True}, rng.randint(0, 3), "json", [])
        elif ending == "cancel":
            await self.send({"sequence_id": sid, "sequence_cancel": True}, 0, "json", [])
        elif ending in ("race", "double"):
            first = (
                {"sequence_id": sid, "sequence_end": True}
                if ending == "race"
                else {"sequence_id": sid, "sequence_cancel": True}
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.send, first, 3, "sse" if ending == "race" else "json", [])
                nursery.start_soon(self.send, {"sequence_id": sid, "sequence_cancel": True}, 0, "json", [])

    async def unloader(self) -> None:
        for _ in range(self.args.unloads):
            await trio.sleep(self.args.seconds_est / (self.args.unloads + 1))
            if self.started >= self.args.sequences:
                return
            reply = await self.client.post("/v2/repository/models/seqcount/unload", json={})
            self.outcomes[f"unload {reply.status_code}"] += 1
            await trio.sleep(0.05)
            reply = await self.client.post("/v2/repository/models/seqcount/load", json={})
            self.outcomes[f"load {reply.status_code}"] += 1

    async def main(self) -> None:
        self.deadline = trio.current_time() + self.args.seconds
        async with self.client, trio.open_nursery() as nursery:
            for index in range(self.args.clients):
                nursery.start_soon(self.worker, index)
            nursery.start_soon(self.unloader)


async def report(url: str) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        reply = await client.post(URL, json={"inputs": [], "parameters": {"report": True}})
        data: list[int] = reply.json()["outputs"][0]["data"]
        return data


async def metric(url: str, name: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        text = (await client.get("/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def row(api_workers: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="seqraces") as tmp:
        repo = Path(tmp)
        shutil.copytree(MODEL, repo / "seqcount")
        settings = json.loads((repo / "seqcount" / "model-settings.json").read_text())
        settings["sequence"] = {
            "idle_timeout_ms": IDLE_MS,
            "max_duration_ms": 15000,
            "max_sequences": 2 * args.clients,
            "evict_idle": True,
            "max_queue": 2,
        }
        (repo / "seqcount" / "model-settings.json").write_text(json.dumps(settings))
        server = Server(repo, api_workers)
        try:
            url = server.url()
            rss_before = trio.run(metric, url, "actorserve_process_resident_memory_bytes")
            run = Run(url, args, random.Random(args.seed))
            began = time.monotonic()
            trio.run(run.main)
            seconds = time.monotonic() - began
            time.sleep(IDLE_MS / 1000 * 3)  # every abandoned sequence expires
            final = trio.run(report, url)
            open_gauge = trio.run(metric, url, "actorserve_sequences_open")
            rss_after = trio.run(metric, url, "actorserve_process_resident_memory_bytes")
        finally:
            code = server.stop()
        tallies = [json.loads(p.read_text()) for p in (repo / "seqcount").glob("tally-*.json")]
    # the last instance wrote its tally at shutdown too: the report is for reference
    states = sum(t[0] for t in tallies)
    ended = sum(t[1] for t in tallies)
    doubles = sum(t[2] for t in tallies)
    return {
        "api_workers": api_workers,
        "sequences": run.started,
        "requests": run.requests,
        "seconds": seconds,
        "outcomes": run.outcomes,
        "others": run.others,
        "state_errors": run.state_errors,
        "hook_states": states,
        "hook_ended": ended,
        "hook_doubles": doubles,
        "slots_held": final[5],
        "open_after_idle": final[4],
        "open_gauge": open_gauge,
        "rss_before_mb": rss_before / 2**20,
        "rss_after_mb": rss_after / 2**20,
        "exit": code,
        "instances": len(tallies),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py sequence_races", description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--api-workers", default="0,2")
    parser.add_argument("--seconds", type=float, default=300.0, help="bound on each row's run")
    parser.add_argument("--unloads", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.seconds_est = min(args.seconds, args.sequences / 40)  # spreads the unloads over the run
    print(
        "| api-workers | sequences | requests | s | ok | expired | cancelled | evicted | ended | shut down "
        "| 429 | other answers | lost | state errors | hooks twice | states not ended | slots held "
        "| open gauge | RSS MB before → after |"
    )
    print("|" + "---|" * 19)
    failed = False
    for workers in [int(w) for w in args.api_workers.split(",")]:
        r = row(workers, args)
        o = r["outcomes"]
        minor = sum(o[k] for k in ("not open", "409 open", "unloading", "cut by client"))
        lost = o["other (lost)"]
        not_ended = r["hook_states"] - r["hook_ended"]
        print(
            f"| {workers} | {r['sequences']} | {r['requests']} | {r['seconds']:.0f} | {o['ok']} | {o['expired']} "
            f"| {o['cancelled']} | {o['evicted']} | {o['ended']} | {o['shut down']} | {o['429']} | {minor} "
            f"| {lost} | {r['state_errors']} | {r['hook_doubles']} | {not_ended} | {r['slots_held']} "
            f"| {r['open_gauge']:.0f} | {r['rss_before_mb']:.0f} → {r['rss_after_mb']:.0f} |"
        )
        details = {k: v for k, v in o.items() if k not in ("ok",)}
        print(
            f"    outcomes {dict(sorted(details.items()))}; model instances {r['instances']}; exit {r['exit']}"
        )
        for text, count in r["others"].most_common(5):
            print(f"    lost: {count} x {text}")
        if lost or r["state_errors"] or r["hook_doubles"] or not_ended or r["slots_held"] or r["open_gauge"]:
            failed = True
    return 1 if failed else 0
