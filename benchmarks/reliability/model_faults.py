"""Model faults: steps that raise for chosen items, return malformed output, hang past step_timeout or leak; only those requests fail (500 naming the model), the server keeps serving.

    python benchmarks/soak.py model_faults [--requests 10000] [--concurrency 16]
        [--hangs 5] [--leak-requests 3000] [--api-workers 0,2]

For each process shape (``--api-workers``), a real ``python -m actorserve`` on 127.0.0.1
(port 0) serves the models of tests/support/rel_faults.py from model folders in a temp
dir, and each case sends its requests (REST unary, every fourth one as SSE) from
``--concurrency`` clients:

- ``raise``: 10 % of the requests make the step raise for their item, mid-stream for
  the SSE ones (the rest share the batches);
- ``malformed``: 10 % get a malformed answer (wrong dtype, shape, BYTES element, not a
  StepOutput, not an InferenceResponse, too few outputs for the batch);
- ``hang``: good load while ``--hangs`` requests hang a step for 5 s past a 1 s
  ``step_timeout``: each fails at the deadline with the items of its batch, the replica
  is replaced;
- ``leak``: every request keeps 256 KiB in its replica for ever; replicas are recycled
  every 250 requests (``max_requests_per_replica``), so the engine's RSS comes back;
  ``leak-kept``: the same model without recycling, for comparison.

A row per case: answers by kind, ``lost`` (no final answer) and ``wrong`` (an error that
is not the intended one), replicas replaced or recycled (from the log), the engine's RSS
(MiB) before / at its peak / after, and whether the server still runs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio
from httpx_sse import aconnect_sse

from ._subprocess_server import Served

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ROOT / "tests" / "support" / "rel_faults.py"
MALFORMED = ("dtype", "shape", "bytes", "notstep", "notresponse", "count")


def model_folder(root: Path) -> Path:
    models = {
        "faulty": {"implementation": "faults.FaultyBatchModel", "workers": 2, "step_timeout": 1.0},
        "faulty_plain": {"implementation": "faults.FaultyModel", "step_timeout": 1.0},
        "leaky": {"implementation": "faults.FaultyBatchModel", "max_requests_per_replica": 250},
        "leaky_kept": {"implementation": "faults.FaultyBatchModel"},
    }
    for name, settings in models.items():
        (root / name).mkdir()
        shutil.copy(FAULTS, root / name / "faults.py")
        (root / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    return root


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, kind: str, detail: str = "") -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if detail and kind not in self.examples:
            self.examples[kind] = detail[:200]


async def one(
    client: httpx.AsyncClient, model: str, rid: str, params: dict[str, Any], sse: bool, tally: Tally
) -> None:
    """Send one request; tally its one final answer: ``ok``, ``failed`` (the intended
    500 naming the model), ``batch`` (failed with its batch: a hung step, or a step
    that returned too few outputs), ``refused`` (503), ``wrong`` (anything else) or
    ``lost`` (no final answer)."""
    intended = bool(params.get("fault")) and params.get("fault") != "leak"
    body = {"id": rid, "inputs": [], "parameters": params}
    try:
        if sse:
            async with aconnect_sse(client, "POST", f"/v2/models/{model}/infer_stream", json=body) as source:
                if source.response.status_code != 200:
                    await source.response.aread()
                    status, error = source.response.status_code, source.response.json().get("error", "")
                else:
                    events = [e async for e in source.aiter_sse()]
                    finals = [e for e in events if e.event == "error"]
                    if not finals:
                        status, error = 200, ""
                    else:
                        data = json.loads(finals[-1].data)
                        status, error = data["status"], data["error"]
                    if len(finals) > 1 or (finals and events[-1] is not finals[-1]):
                        tally.add("wrong", f"{rid}: {[e.event for e in events]}")
                        return
        else:
            reply = await client.post(f"/v2/models/{model}/infer", json=body)
            status = reply.status_code
            error = reply.json().get("error", "") if status != 200 else ""
    except (httpx.HTTPError, ValueError) as exc:
        tally.add("lost", f"{rid}: {type(exc).__name__}: {exc}")
        return
    if status == 200:
        tally.add("ok" if not intended else "wrong", rid)
    elif status == 500 and not intended and ("step_timeout" in error or "outputs for" in error):
        tally.add("batch", error)  # its batch broke: a hung step, or too few outputs
    elif status == 503:
        tally.add("refused", error)
    elif status == 500 and intended and f"model {model!r}" in error:
        tally.add("failed", error)
    else:
        tally.add("wrong", f"{rid}: {status} {error}")


async def drive(url: str, model: str, plan: list[tuple[str, dict[str, Any]]], concurrency: int) -> Tally:
    tally = Tally()
    queue = iter(plan)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def worker() -> None:
            for index, (rid, params) in enumerate(queue):
                await one(client, model, rid, params, sse=hash(rid) % 4 == 0, tally=tally)
                del index

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    return tally


def plan_of(case: str, requests: int, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    plan = []
    for k in range(requests):
        params: dict[str, Any] = {"n": rng.randint(1, 4)}
        if rng.random() < 0.1:
            fault = "raise" if case == "raise" else rng.choice(MALFORMED)
            params.update(fault=fault, at=rng.randint(1, params["n"]))
        plan.append((f"{case}-{k}", params))
    return plan


async def hang_case(url: str, requests: int, hangs: int, concurrency: int) -> Tally:
    rng = random.Random(3)
    plan = [(f"h-{k}", {"n": rng.randint(1, 4)}) for k in range(requests)]
    tally = Tally()
    async with trio.open_nursery() as nursery:

        async def good() -> None:
            result = await drive(url, "faulty", plan, concurrency)
            for kind, count in result.counts.items():
                tally.counts[kind] = tally.counts.get(kind, 0) + count
            tally.examples.update(result.examples)

        nursery.start_soon(good)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for k in range(hangs):
                await trio.sleep(1.5)
                await one(client, "faulty", f"hang-{k}", {"fault": "hang", "hang": 5, "n": 1}, False, tally)
                await one(
                    client,
                    "faulty_plain",
                    f"phang-{k}",
                    {"fault": "hang", "hang": 5, "n": 1},
                    k % 2 == 1,
                    tally,
                )
    return tally


def row(
    case: str,
    workers: int,
    seconds: float,
    tally: Tally,
    server: Served,
    rss: tuple[float, float, float],
    extra: str,
) -> None:
    c = tally.counts
    total = sum(c.values())
    alive = "yes" if server.process.poll() is None else "NO"
    print(
        f"| {case:<9} | {workers} | {total:>6} | {c.get('ok', 0):>6} | {c.get('failed', 0):>5} | {c.get('batch', 0):>5} "
        f"| {c.get('refused', 0):>3} | {c.get('wrong', 0):>5} | {c.get('lost', 0):>4} | {extra:<14} "
        f"| {rss[0]:>5.0f} / {rss[1]:>5.0f} / {rss[2]:>5.0f} | {seconds:>5.1f} | {alive} |",
        flush=True,
    )
    for kind in ("wrong", "lost"):
        if kind in tally.examples:
            print(f"    e.g. {kind}: {tally.examples[kind]}", flush=True)


async def sample_peak(server: Served, peak: list[float]) -> None:
    while True:
        peak[0] = max(peak[0], server.rss_mib())
        await trio.sleep(0.2)


async def run_shape(args: argparse.Namespace, workers: int, folder: Path) -> bool:
    server = Served(workers, "--grace-period", "2", models=folder)
    healthy = True
    try:
        for case in ("raise", "malformed", "hang", "leak", "leak-kept"):
            before = server.rss_mib()
            peak = [before]
            started = time.monotonic()
            replaced, recycled = server.count("declared hung"), server.count("recycled after")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample_peak, server, peak)
                if case == "hang":
                    tally = await hang_case(server.url, args.requests // 4, args.hangs, args.concurrency)
                elif case.startswith("leak"):
                    plan = [(f"l-{k}", {"fault": "leak", "n": 1}) for k in range(args.leak_requests)]
                    model = "leaky" if case == "leak" else "leaky_kept"
                    tally = await drive(server.url, model, plan, args.concurrency)
                    await trio.sleep(1.0)  # the last worn replica drains and is unloaded
                else:
                    tally = await drive(
                        server.url, "faulty", plan_of(case, args.requests, random.Random(7)), args.concurrency
                    )
                nursery.cancel_scope.cancel()
            seconds = time.monotonic() - started
            extra = {
                "hang": f"replaced {server.count('declared hung') - replaced}",
                "leak": f"recycled {server.count('recycled after') - recycled}",
            }.get(case, "")
            row(case, workers, seconds, tally, server, (before, peak[0], server.rss_mib()), extra)
            healthy &= not tally.counts.get("wrong") and not tally.counts.get("lost")
        healthy &= server.process.poll() is None
    finally:
        server.stop()
    return healthy


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py model_faults", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=20_000, help="requests of the raise and malformed cases"
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--hangs", type=int, default=5, help="hung steps in the hang case (per model)")
    parser.add_argument("--leak-requests", type=int, default=3000)
    parser.add_argument("--api-workers", default="0,2", help="process shapes to run, comma-separated")
    args = parser.parse_args(argv)
    print(
        "| case      | W | answers |     ok | fail | batch | 503 | wrong | lost | replicas       "
        "| RSS MiB before / peak / after | s     | alive |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    healthy = True
    for workers in (int(w) for w in args.api_workers.split(",")):
        with tempfile.TemporaryDirectory(prefix="model-faults-") as tmp:
            healthy &= trio.run(run_shape, args, workers, model_folder(Path(tmp)))
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
