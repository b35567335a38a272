"""The ``text`` model end to end: tokens/s, time to first token and inter-token latency
(prints numbers; not a test).

    python benchmarks/textlm.py [--rounds 3] [--tokens 128] [--streams 1,16,64] [--skip-itl]

1. Starts ``python -m actorserve --host 127.0.0.1 --http-port P --grpc-port Q`` (the
   built-in models) on free ports and runs N concurrent streams of ``--tokens`` characters
   (temperature 0.8, a seed per stream) for N in ``--streams``:
   - over SSE: ``POST /v2/models/text/generate_stream`` (Triton's generate shape), read
     with aiohttp;
   - over gRPC: one ``ModelStreamInfer`` call per stream (Triton's envelope), grpc.aio
     with pre-serialised requests;
   - the limit: the same batched loop in this process with no server (N rows through
     ``TextLMCore.decode`` and the model's sampler, ``--tokens`` times).
   Rounds are interleaved; the best round of each is printed (the machine is shared).
2. Chunked prefill (in-process engine, no network): ITL of 16 running streams while
   2,000-character prompts arrive (one, or eight 150 ms apart), with ``prefill_chunk`` 16,
   32 and 64 and with the whole prompt read in one step.

Every phase is bounded by timeouts.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import asyncio
import importlib
import itertools
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

# This folder holds grpc.py: keep it off sys.path, or `import grpc` finds that file.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "ROMEO:\n"
TEMPERATURE = 0.8
READY_TIMEOUT = 90.0
PHASE_TIMEOUT = 300.0
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


# -- statistics --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Run:
    """One measured run: N streams, each with a start time and the arrival time of
    every token."""

    def __init__(self, n_streams: int) -> None:
        self.starts = [0.0] * n_streams
        self.arrivals: list[list[float]] = [[] for _ in range(n_streams)]

    def summary(self) -> dict[str, float]:
        ttft = [a[0] - s for s, a in zip(self.starts, self.arrivals, strict=True) if a]
        itl = [b - a for times in self.arrivals for a, b in itertools.pairwise(times)]
        tokens = sum(len(a) for a in self.arrivals)
        elapsed = max(a[-1] for a in self.arrivals if a) - min(self.starts)
        return {
            "tok_s": tokens / elapsed,
            "ttft_p50": 1e3 * percentile(ttft, 0.5),
            "ttft_p99": 1e3 * percentile(ttft, 0.99),
            "itl_p50": 1e3 * percentile(itl, 0.5),
            "itl_p99": 1e3 * percentile(itl, 0.99),
            "tokens": tokens,
        }


# -- the server process ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m actorserve`` in its own process group, stopped with SIGINT."""

    def __init__(self) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        argv = [
            sys.executable,
            "-m",
            "actorserve",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--log-level",
            "WARNING",
        ]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.http_port}"

    async def wait_ready(self) -> None:
        import aiohttp

        deadline = time.monotonic() + READY_TIMEOUT
        async with aiohttp.ClientSession() as session:
            while True:
                if self.proc.poll() is not None:
                    raise SystemExit(f"the server exited with {self.proc.returncode}")
                try:
                    async with session.get(f"{self.url}/v2/health/ready") as reply:
                        if reply.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not become ready")
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# -- clients -----------------------------------------------------------------------------------


def parameters(model: str, seed: int, tokens: int) -> dict[str, Any]:
    """``text``: max_tokens characters; ``streamer`` (no model compute: the transport's
    ceiling): n_tokens responses."""
    if model == "streamer":
        return {"n_tokens": tokens}
    return {"max_tokens": tokens, "temperature": TEMPERATURE, "seed": seed}


async def sse_run(url: str, n_streams: int, tokens: int, model: str = "text") -> Run:
    """N concurrent generate_stream requests; an event's time is when its last byte came."""
    import aiohttp

    run = Run(n_streams)
    bodies = [
        orjson.dumps({"text_input": PROMPT, "parameters": parameters(model, 1000 + i, tokens)})
        for i in range(n_streams)
    ]
    target = f"{url}/v2/models/{model}/generate_stream"
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=n_streams)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=PHASE_TIMEOUT)
    ) as session:

        async def one(i: int) -> None:
            arrivals = run.arrivals[i]
            run.starts[i] = time.perf_counter()
            async with session.post(target, data=bodies[i], headers=headers) as reply:
                if reply.status != 200:
                    raise RuntimeError(f"HTTP {reply.status}: {await reply.text()}")
                tail = b""
                async for chunk in reply.content.iter_any():
                    now = time.perf_counter()
                    data = tail + chunk
                    events = data.count(b"\n\n")
                    if events:
                        if b"event: error" in data:
                            raise RuntimeError(data.decode())
                        arrivals.extend([now] * events)
                        tail = data[data.rfind(b"\n\n") + 2 :]
                    else:
                        tail = data
            if len(arrivals) != tokens:
                raise RuntimeError(f"stream {i}: {len(arrivals)} events, expected {tokens}")

        await asyncio.gather(*(one(i) for i in range(n_streams)))
    return run


def grpc_requests(n_streams: int, tokens: int, model: str = "text") -> list[bytes]:
    import numpy as np

    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    text = np.empty(1, dtype=object)
    text[0] = PROMPT.encode()
    return [
        bytes(
            request_to_pb(
                InferenceRequest(
                    [tensor_from_numpy("text_input", text, "BYTES")],
                    id=f"s{i}",
                    parameters=parameters(model, 1000 + i, tokens),
                ),
                model_name=model,
            )
        )
        for i in range(n_streams)
    ]


async def grpc_run(port: int, n_streams: int, tokens: int, bodies: list[bytes]) -> Run:
    """One ModelStreamInfer call per stream; each reads exactly ``tokens`` responses.
    A response with ``error_message`` (field 1) starts with byte 0x0a."""
    grpc_aio: Any = importlib.import_module("grpc.aio")
    run = Run(n_streams)
    async with grpc_aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        open_stream = channel.stream_stream(STREAM_INFER)

        async def one(i: int) -> None:
            arrivals = run.arrivals[i]
            call = open_stream(timeout=PHASE_TIMEOUT)
            run.starts[i] = time.perf_counter()
            await call.write(bodies[i])
            for _ in range(tokens):
                message = await call.read()
                arrivals.append(time.perf_counter())
                if message is grpc_aio.EOF:
                    raise RuntimeError(f"stream ended early: {await call.code()} {await call.details()}")
                if message[:1] == b"\x0a":
                    raise RuntimeError(f"in-band error: {message!r}")
            await call.done_writing()
            while await call.read() is not grpc_aio.EOF:
                pass

        await asyncio.gather(*(one(i) for i in range(n_streams)))
    return run


def in_process_limit(core: Any, n_streams: int, tokens: int) -> Run:
    """The batched loop with no server: prefill N prompts, then ``tokens`` times one
    decode of all N rows and one sampling of all N rows (the model's own sampler)."""
    import torch

    from actorserve.models.text import sample_rows

    run = Run(n_streams)
    temps, top_ks = [TEMPERATURE] * n_streams, [0] * n_streams
    ids = core.vocab.encode(PROMPT)
    with torch.inference_mode():
        start = time.perf_counter()
        run.starts = [start] * n_streams
        # each stream's uniforms, drawn ahead from its own generator as the model does
        draws = [
            torch.rand(tokens, generator=core.make_generator(1000 + i), dtype=torch.float64).tolist()
            for i in range(n_streams)
        ]
        states, logits = core.prefill([core.initial_state() for _ in range(n_streams)], [ids] * n_streams)
        stacked = torch.stack(states, dim=1)
        for step in range(tokens):
            chosen = sample_rows(logits.cpu(), temps, top_ks, [row[step] for row in draws])
            now = time.perf_counter()
            for times in run.arrivals:
                times.append(now)
            if step + 1 < tokens:
                stacked, logits = core.decode(stacked, chosen)
    return run


# -- chunked prefill ---------------------------------------------------------------------------


async def itl_under_prefill(
    chunk: int, running: int, arrivals: int, prompt_chars: int, gap: float
) -> dict[str, float]:
    """ITL of ``running`` streams while ``arrivals`` prompts of ``prompt_chars`` arrive
    every ``gap`` seconds (in-process engine)."""
    import numpy as np
    import trio

    import actorserve
    from actorserve import InferenceRequest
    from actorserve.codecs import tensor_from_numpy
    from actorserve.models import builtin_settings

    (text_settings,) = [m for m in builtin_settings() if m.name == "text"]
    settings = actorserve.ModelSettings(
        name="text",
        implementation=text_settings.implementation,
        parameters={**text_settings.parameters, "prefill_chunk": chunk, "max_prompt_chars": 100_000},
    )

    def request(prompt: str, tokens: int, seed: int) -> InferenceRequest:
        data = np.empty(1, dtype=object)
        data[0] = prompt.encode()
        return InferenceRequest(
            [tensor_from_numpy("text_input", data, "BYTES")],
            parameters={"max_tokens": tokens, "temperature": TEMPERATURE, "seed": seed},
        )

    gaps: list[float] = []
    ttft: list[float] = []
    long_prompt = ("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 100)[:prompt_chars]
    window = [0.0, 0.0]
    with trio.fail_after(PHASE_TIMEOUT):
        async with actorserve.open_engine([settings]) as engine:
            done = trio.Event()

            async def stream(i: int) -> None:
                last = None
                async with engine.infer_stream(request(PROMPT, 2048, i), model="text") as responses:
                    async for _ in responses:
                        now = trio.current_time()
                        if last is not None and window[0] <= now <= window[1]:
                            gaps.append(now - last)
                        last = now
                        if done.is_set():
                            break

            async def arrive(i: int) -> None:
                start = trio.current_time()
                async with engine.infer_stream(
                    request(long_prompt, 8, 10_000 + i), model="text"
                ) as responses:
                    async for _ in responses:
                        ttft.append(trio.current_time() - start)
                        break

            async with trio.open_nursery() as nursery:
                for i in range(running):
                    nursery.start_soon(stream, i)
                await trio.sleep(0.5)  # the running streams are decoding
                window[0], window[1] = trio.current_time(), float("inf")
                async with trio.open_nursery() as arrivals_nursery:
                    for i in range(arrivals):
                        arrivals_nursery.start_soon(arrive, i)
                        await trio.sleep(gap)
                window[1] = trio.current_time()
                done.set()
    return {
        "itl_p50": 1e3 * percentile(gaps, 0.5),
        "itl_p99": 1e3 * percentile(gaps, 0.99),
        "itl_max": 1e3 * max(gaps),
        "ttft_p50": 1e3 * percentile(ttft, 0.5),
        "ttft_max": 1e3 * max(ttft),
    }


# -- main --------------------------------------------------------------------------------------


PATHS = ("in-process", "SSE", "gRPC", "SSE streamer", "gRPC streamer")


def measure(path: str, n: int, tokens: int, core: Any, server: ServerProcess) -> dict[str, float]:
    """One run of N streams on one path (``streamer``: the same traffic with no model
    compute, i.e. what the transport alone can carry)."""
    if path == "in-process":
        return in_process_limit(core, n, tokens).summary()
    model = "streamer" if path.endswith("streamer") else "text"
    if path.startswith("SSE"):
        return asyncio.run(sse_run(server.url, n, tokens, model)).summary()
    bodies = grpc_requests(n, tokens, model)
    return asyncio.run(grpc_run(server.grpc_port, n, tokens, bodies)).summary()


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    return max(runs, key=lambda r: r["tok_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--skip-itl", action="store_true", help="skip the chunked-prefill phase")
    parser.add_argument("--skip-server", action="store_true", help="only the chunked-prefill phase")
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    print(
        f"cpus: {os.cpu_count()}  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True
    )

    if not args.skip_server:
        import torch

        from actorserve.models.textlm.network import TextLMCore

        torch.set_num_threads(1)
        core = TextLMCore.load()
        server = ServerProcess()
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        try:
            asyncio.run(server.wait_ready())
            asyncio.run(sse_run(server.url, 4, 16))  # warm up both paths
            asyncio.run(grpc_run(server.grpc_port, 4, 16, grpc_requests(4, 16)))
            for _ in range(args.rounds):
                for n in counts:
                    for path in PATHS:
                        results.setdefault((path, n), []).append(measure(path, n, args.tokens, core, server))
        finally:
            server.stop()
        print(
            f"\n{args.tokens} tokens per stream, temperature {TEMPERATURE}; best of {args.rounds} rounds (by tok/s)"
        )
        print(
            f"{'path':<13} {'streams':>7} {'tok/s':>8} {'vs limit':>8} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7}  (ms)"
        )
        for n in counts:
            limit = best(results["in-process", n])["tok_s"]
            for path in PATHS:
                r = best(results[path, n])
                print(
                    f"{path:<13} {n:>7} {r['tok_s']:>8.0f} {r['tok_s'] / limit:>8.2f} {r['ttft_p50']:>9.1f} "
                    f"{r['ttft_p99']:>7.1f} {r['itl_p50']:>8.2f} {r['itl_p99']:>7.2f}",
                    flush=True,
                )

    if not args.skip_itl:
        import trio

        print("\nchunked prefill (in-process engine): ITL of 16 running streams while prompts of 2,000")
        print("characters arrive; TTFT of those prompts")
        print(
            f"{'arrivals':>22} {'prefill_chunk':>13} {'ITL p50':>8} {'p99':>7} {'max':>7} {'TTFT p50':>9} {'max':>7}  (ms)"
        )
        for arrivals, label in ((1, "1"), (8, "8, 150 ms apart")):
            for chunk in (16, 32, 64, 2000):
                r = trio.run(itl_under_prefill, chunk, 16, arrivals, 2000, 0.15)
                name = f"{chunk}" if chunk < 2000 else "whole prompt"
                print(
                    f"{label:>22} {name:>13} {r['itl_p50']:>8.2f} {r['itl_p99']:>7.2f} {r['itl_max']:>7.1f} "
                    f"{r['ttft_p50']:>9.1f} {r['ttft_max']:>7.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
