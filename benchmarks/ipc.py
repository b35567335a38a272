"""Engine link benchmark: tokens/s of N concurrent streams in process vs through an
EngineClient over a Unix socket to the engine in a child process.

    python benchmarks/ipc.py [--rounds 3] [--tokens 256]

For each model (``streamer``: no compute, all overhead; ``stepper``: a batched
[B,1024] chain, benchmarks/models/stepper) and N in 1, 16, 64 it prints the best of
``--rounds`` runs: in process (``open_engine`` in this trio run), over the link to an
engine in this same process (the link's cost on one core), and over the link to
``python -m actorserve.server.engine_main`` in a child process (the real shape: the front's
loop and the engine's loop on two cores).
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")  # one BLAS thread, as the stepper contract says

import argparse
import functools
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import trio

import actorserve
from actorserve import InferenceRequest
from actorserve.api import EngineAPI
from actorserve.codecs import tensor_from_numpy
from actorserve.ipc import open_engine_client
from actorserve.ipc.engine_side import open_unix_listener, serve_fronts
from actorserve.server.engine_main import READY_LINE
from actorserve.settings import discover_models

ROOT = Path(__file__).resolve().parents[1]
STEPPER = ROOT / "benchmarks" / "models" / "stepper"
STREAMS = (1, 16, 64)


async def run_streams(engine: EngineAPI, model: str, streams: int, tokens: int) -> float:
    """tokens/s of ``streams`` concurrent streams of ``tokens`` each."""
    text = np.empty(1, dtype=object)
    text[0] = b"hello"
    counts = [0] * streams

    async def one(i: int) -> None:
        request = InferenceRequest(
            [tensor_from_numpy("text_input", text, "BYTES")], id=f"b{i}", parameters={"n_tokens": tokens}
        )
        async with engine.infer_stream(request, model=model) as responses:
            while True:
                try:
                    counts[i] += len(await responses.next_batch())
                except StopAsyncIteration:
                    break

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(one, i)
    elapsed = trio.current_time() - start
    assert counts == [tokens] * streams, counts
    return streams * tokens / elapsed


@asynccontextmanager
async def child_engine(socket_path: str) -> AsyncIterator[None]:
    """``python -m actorserve.server.engine_main`` with the built-in models and the stepper."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    command = [sys.executable, "-m", "actorserve.server.engine_main", socket_path, str(STEPPER)]
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(60):
            while READY_LINE.encode() not in seen:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"the engine process exited: {process.returncode}")
                seen += chunk
        yield
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        process.kill()


async def best(engine: EngineAPI, model: str, streams: int, tokens: int, rounds: int) -> float:
    await run_streams(engine, model, min(streams, 4), 8)  # warm up
    return max([await run_streams(engine, model, streams, tokens) for _ in range(rounds)])


async def main_async(rounds: int, tokens: int) -> None:
    models = [m for m in actorserve.settings.builtin_models() if m.name == "streamer"] + discover_models(
        STEPPER
    )
    results: dict[tuple[str, int], list[float]] = {}
    plan = [(model, streams) for model in ("streamer", "stepper") for streams in STREAMS]
    per_model = {"streamer": tokens, "stepper": 64}
    with tempfile.TemporaryDirectory(prefix="asbench-") as folder:
        async with actorserve.open_engine(models) as engine:
            for model, streams in plan:
                results[(model, streams)] = [await best(engine, model, streams, per_model[model], rounds)]
            path = os.path.join(folder, "same.sock")
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(serve_fronts, engine, await open_unix_listener(path)))
                async with open_engine_client(path) as client:
                    for model, streams in plan:
                        results[(model, streams)].append(
                            await best(client, model, streams, per_model[model], rounds)
                        )
                nursery.cancel_scope.cancel()
        path = os.path.join(folder, "child.sock")
        async with child_engine(path), open_engine_client(path) as client:
            for model, streams in plan:
                results[(model, streams)].append(await best(client, model, streams, per_model[model], rounds))
    print(
        f"{'model':>9} {'streams':>8} {'in process':>11} {'link, 1 proc':>13} {'link, 2 procs':>14} {'2 procs/in':>11}"
    )
    for (model, streams), (inproc, same, child) in results.items():
        print(
            f"{model:>9} {streams:>8} {inproc:>11,.0f} {same:>13,.0f} {child:>14,.0f} {child / inproc:>11.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per streamer stream")
    args = parser.parse_args()
    trio.run(main_async, args.rounds, args.tokens)


if __name__ == "__main__":
    main()
