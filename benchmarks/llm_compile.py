"""The ``transformers`` runtime's decode eager against compiled (inductor), in float32 and
bf16, over ``/v1/completions`` streamed from a local actorserve (prints numbers; not a
test).

    python benchmarks/llm_compile.py [--streams 1,8,32] [--prompt 128] [--tokens 128]
        [--width 512] [--layers 8] [--threads 1] [--pin 0] [--rounds 3]
        [--configs eager/float32,inductor/float32,eager/bfloat16,inductor/bfloat16]

Builds a Llama checkpoint from a config with random weights (width 512, 8 layers, a
4096-token byte-level BPE vocabulary: about 30 M parameters, the shape of issue 36;
nothing is downloaded), starts one ``python -m actorserve`` per config (``compile`` /
``dtype`` of the model's parameters, ``compile_after`` 0), all at once (pinned with
``taskset -c PIN`` when ``--pin`` is given; ``--api-workers 0``, ``--threads`` torch
threads), and for each N sends N concurrent streamed ``/v1/completions`` (``--prompt``
tokens of Shakespeare, a different passage per client, ``--tokens`` generated, greedy;
the tokens counted are the ``usage`` the last chunk reports). A compiled config first
warms up: the round is repeated until one passes in which no bucket started a compile
(the server's log says when a compile starts and ends), so its figures are the compiled
decode's; the warm-up's time and each compile's are printed. Then ``--rounds`` rounds,
the configs interleaved in each (a change of the shared machine's load falls on all of
them). Tokens/s = generated tokens / the wall time of a round; TTFT = the time to the
first streamed text; the medians of the rounds, and their ratios to the first config.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


async def serve(args: argparse.Namespace, folder: Path, work: Path, config: str) -> tuple[str, Any, Path]:
    """Start a server of ``config`` on a copy of the checkpoint folder: (url, process, log)."""
    mode, dtype = config.split("/")
    served = work / config.replace("/", "-")
    shutil.copytree(folder, served)
    settings = {
        "name": "llm",
        "implementation": "transformers",
        "max_batch_size": max(args.streams),
        "parameters": {"threads": args.threads, "dtype": dtype, "compile": mode, "compile_after": 0},
    }
    (served / "model-settings.json").write_text(json.dumps(settings))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    pin = ["taskset", "-c", args.pin] if args.pin else []
    command = [*pin, sys.executable, "-m", "actorserve", "--host", "127.0.0.1", "--http-port", str(port)]
    command += ["--grpc-port", "off", "--api-workers", "0", str(served)]
    log = work / f"{mode}-{dtype}.log"
    return url, start(command, log, {"PYTHONPATH": str(ROOT)}), log


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
        print(f"; servers pinned to core {args.pin}" if args.pin else "; servers not pinned")
        print(f"{args.prompt}-token prompts, {args.tokens} generated, greedy, /v1/completions streamed")
        servers = {config: await serve(args, folder, work, config) for config in args.configs}
        table: dict[str, dict[int, list[tuple[float, float]]]] = {config: {} for config in args.configs}
        try:
            for url, process, log in servers.values():
                await wait_ready(url, process, log)
            for n in args.streams:
                texts = prompts(folder, n, args.prompt)
                for config, (url, _, log) in servers.items():  # warm-up: compiles, caches
                    if config.startswith("eager"):
                        await measure(url, texts, 8)
                    else:
                        seconds = await warm(url, texts, args.tokens, log)
                        print(f"  {config} c={n}: warm-up {seconds:.1f} s", flush=True)
                for _ in range(args.rounds):  # the configs interleaved: the machine's load falls on all
                    for config, (url, _, _) in servers.items():
                        table[config].setdefault(n, []).append(await measure(url, texts, args.tokens))
                for config in args.configs:
                    rates = [rate for rate, _ in table[config][n]]
                    ttft = statistics.median(t for _, t in table[config][n])
                    print(f"  {config:>18} c={n:>2}: {statistics.median(rates):7.1f} tok/s (rounds ", end="")
                    print(f"{', '.join(f'{r:.0f}' for r in rates)})  TTFT p50 {ttft:7.1f} ms", flush=True)
            for config, (_, _, log) in servers.items():
                for line in log.read_text(errors="replace").splitlines():
                    if "compiled the decode" in line or "torch.compile failed" in line:
                        print(f"  {config}: {line.split(' ', 2)[-1]}", flush=True)
        finally:
            for _, process, _ in servers.values():
                stop(process)
        print(f"\nratios to {args.configs[0]}, medians of the rounds (tok/s; TTFT p50)")
        base = table[args.configs[0]]
        for config in args.configs:
            cells = []
            for n in args.streams:
                rate = statistics.median(r for r, _ in table[config][n]) / statistics.median(
                    r for r, _ in base[n]
                )
                ttft = statistics.median(t for _, t in table[config][n]) / statistics.median(
                    t for _, t in base[n]
                )
                cells.append(f"c={n}: {rate:.2f}; {ttft:.2f}")
            print(f"  {config:>18}: " + " | ".join(cells))


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
    parser.add_argument("--pin", default="", help="taskset the servers to these cores (e.g. 0)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--configs",
        default="eager/float32,inductor/float32,eager/bfloat16,inductor/bfloat16",
        type=lambda s: s.split(","),
    )
    trio.run(main, parser.parse_args())
