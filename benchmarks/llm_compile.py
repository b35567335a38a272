"""The ``transformers`` runtime's decode eager against compiled (inductor), in float32 and
bf16, over ``/v1/completions`` streamed from a local actorserve (prints numbers; not a
test).

    python benchmarks/llm_compile.py [--streams 1,8,32] [--prompt 128] [--tokens 128]
        [--width 512] [--layers 8] [--threads 1] [--pin 0] [--rounds 1]
        [--configs eager/float32,inductor/float32,eager/bfloat16,inductor/bfloat16]

Builds a Llama checkpoint from a config with random weights (width 512, 8 layers, a
4096-token byte-level BPE vocabulary: about 30 M parameters, the shape of issue 36;
nothing is downloaded), then for each config (``compile``/``dtype`` of the model's
parameters) starts ``python -m actorserve`` on it (pinned with ``taskset -c PIN`` when
``--pin`` is given, ``--api-workers 0``, ``--threads`` torch threads) and, for each N,
sends N concurrent streamed ``/v1/completions`` (``--prompt`` tokens of Shakespeare, a
different passage per client, ``--tokens`` generated, greedy, ``ignore``-free: the
tokens counted are the ones streamed, as ``usage`` reports them). A compiled config
first warms up: the round is repeated until one passes in which no bucket started a
compile (the server's log says when a compile starts and ends; ``compile_after`` is 0),
so the figures are the compiled decode's; the warm-up's time and each compile's are
printed. Tokens/s = generated tokens / the wall time of the round;
TTFT = the time to the first streamed text; the best of ``--rounds``. The configs run
one after the other; on a shared machine compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from llm_vs_mlserver import ROOT, build, free_port, prompts, start, stop, wait_ready

ROUND_TIMEOUT = 1800.0
WARM_ROUNDS = 16


async def one(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> tuple[float, int]:
    """TTFT (s) and tokens generated of one streamed completion."""
    body = {"model": "llm", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    ttft, count = 0.0, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text") and not ttft:
                ttft = time.perf_counter() - started
            if event.get("usage"):
                count = int(event["usage"]["completion_tokens"])
    return ttft, count


async def measure(url: str, texts: list[str], tokens: int) -> tuple[float, float]:
    """tokens/s and TTFT p50 (ms) of one round of ``len(texts)`` concurrent requests."""
    ttfts: list[float] = []
    generated = 0

    async def client_task(client: httpx.AsyncClient, prompt: str) -> None:
        nonlocal generated
        ttft, count = await one(client, url, prompt, tokens)
        ttfts.append(ttft)
        generated += count

    limits = httpx.Limits(max_connections=len(texts) + 4)
    async with httpx.AsyncClient(timeout=ROUND_TIMEOUT, limits=limits) as client:
        started = time.perf_counter()
        with trio.fail_after(ROUND_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for prompt in texts:
                    nursery.start_soon(client_task, client, prompt)
        return generated / (time.perf_counter() - started), statistics.median(ttfts) * 1000


def compiles(log: Path) -> tuple[int, int]:
    """Compiles started and ended (or failed) so far, from the server's log."""
    text = log.read_text(errors="replace")
    return text.count("compiling the decode of bucket"), text.count(
        "compiled the decode of bucket"
    ) + text.count("torch.compile failed")


async def warm(url: str, texts: list[str], tokens: int, log: Path) -> float:
    """Repeat the round until no bucket starts a compile during one; the seconds it took."""
    started = time.perf_counter()
    for _ in range(WARM_ROUNDS):
        before = compiles(log)[0]
        await measure(url, texts, tokens)
        for _ in range(int(ROUND_TIMEOUT)):  # a compile under way: wait for it
            begun, ended = compiles(log)
            if begun == ended:
                break
            await trio.sleep(1.0)
        if begun == before:
            break
    return time.perf_counter() - started


async def run(
    args: argparse.Namespace, folder: Path, work: Path, config: str
) -> dict[int, tuple[float, float]]:
    mode, dtype = config.split("/")
    settings = {
        "name": "llm",
        "implementation": "transformers",
        "max_batch_size": max(args.streams),
        "parameters": {"threads": args.threads, "dtype": dtype, "compile": mode, "compile_after": 0},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pin = ["taskset", "-c", args.pin] if args.pin else []
    command = [*pin, sys.executable, "-m", "actorserve", "--host", "127.0.0.1", "--http-port", str(port)]
    command += ["--grpc-port", "off", "--api-workers", "0", str(folder)]
    log = work / f"{mode}-{dtype}.log"
    process = start(command, log, {"PYTHONPATH": str(ROOT)})
    results: dict[int, tuple[float, float]] = {}
    try:
        await wait_ready(url, process, log)
        for n in args.streams:
            texts = prompts(folder, n, args.prompt)
            if mode != "eager":
                seconds = await warm(url, texts, args.tokens, log)
                print(f"  {config} {n:>3}: warm-up (compiles) {seconds:6.1f} s", flush=True)
            else:
                await measure(url, texts[:1], 8)
            for _ in range(args.rounds):
                rate, ttft = await measure(url, texts, args.tokens)
                if rate > results.get(n, (0.0, 0.0))[0]:
                    results[n] = (rate, ttft)
            print(
                f"  {config} {n:>3} streams: {results[n][0]:7.1f} tok/s  TTFT p50 {results[n][1]:8.1f} ms",
                flush=True,
            )
        for line in log.read_text(errors="replace").splitlines():
            if "compiled the decode" in line or "torch.compile failed" in line:
                print(f"  {config}: {line.split(' ', 2)[-1]}", flush=True)
    finally:
        stop(process)
    return results


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = build(
            work / "llm",
            "llama",
            width=args.width,
            layers=args.layers,
            std=0.02,
            vocab_size=4096,
            context=1024,
        )
        print(
            f"llama {args.layers} layers, width {args.width}, vocab 4096; {args.threads} torch thread(s)",
            end="",
        )
        print(f"; server pinned to core {args.pin}" if args.pin else "; server not pinned")
        print(f"{args.prompt}-token prompts, {args.tokens} generated, greedy, /v1/completions streamed")
        table = {config: await run(args, folder, work, config) for config in args.configs}
        base = table[args.configs[0]]
        print(f"\nratios to {args.configs[0]} (tok/s; TTFT p50)")
        for config, results in table.items():
            cells = [
                f"{results[n][0] / base[n][0]:.2f}; {results[n][1] / base[n][1]:.2f}" for n in args.streams
            ]
            print(
                f"  {config:>20}: "
                + " | ".join(f"c={n}: {c}" for n, c in zip(args.streams, cells, strict=True))
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pin", default="", help="taskset the server to these cores (e.g. 0)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--configs",
        default="eager/float32,inductor/float32,eager/bfloat16,inductor/bfloat16",
        type=lambda s: s.split(","),
    )
    trio.run(main, parser.parse_args())
