"""The ``transformers`` runtime in process: generated tokens/s at N concurrent streams
against the same model's own static-batch ``generate``, time to first token and the
cache memory per sequence (prints numbers; not a test).

    python benchmarks/llm_throughput.py [--streams 1,8,32] [--prompt 128] [--tokens 128]
        [--width 384] [--layers 6] [--threads 1] [--device cpu|cuda] [--rounds 2]

Builds a GPT-2 checkpoint of realistic shape for a CPU (width 384, 6 layers, a 4096-token
byte-level BPE vocabulary trained on tests/data/tinyshakespeare.txt: ~18 M
parameters) in a temporary folder, then for each N:
- the runtime: N requests (``--prompt`` tokens of Shakespeare each, a different offset
  per stream, ``--tokens`` generated, sampled with a seed) through an in-process engine,
  all at once; tokens/s = the tokens the model generated (usage) / wall time;
- the limit: ``model.generate`` on a static batch of the same N prompts
  (``min_new_tokens`` = ``max_new_tokens``), the same dtype and device;
- TTFT: the time from sending to a stream's first text.
The best of ``--rounds`` is printed (the machine may be shared). Every phase is bounded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.tiny_llm import build, training_text

import actorserve
from actorserve.codecs import tensor_from_numpy
from actorserve.models.llm import TransformersModel
from actorserve.modelsettings import model_settings_from_dict
from actorserve.types import InferenceRequest

TIMEOUT = 1800.0


def prompts(tokenizer: object, count: int, length: int) -> list[list[int]]:
    ids: list[int] = tokenizer(training_text())["input_ids"]  # type: ignore[operator]
    step = max(1, (len(ids) - length) // max(1, count))
    return [ids[i * step : i * step + length] for i in range(count)]


async def runtime_round(
    engine: actorserve.Engine, texts: list[str], tokens: int
) -> tuple[float, int, list[float]]:
    generated = 0
    ttft: list[float] = []

    async def one(i: int) -> None:
        nonlocal generated
        data = np.empty(1, dtype=object)
        data[0] = texts[i].encode()
        params = {"max_tokens": tokens, "temperature": 1.0, "seed": i, "usage": True}
        request = InferenceRequest([tensor_from_numpy("text_input", data, "BYTES")], parameters=params)
        sent = time.perf_counter()
        first = True
        async with engine.infer_stream(request, model="llm") as responses:
            async for response in responses:
                if first:
                    ttft.append(time.perf_counter() - sent)
                    first = False
                if "completion_tokens" in response.parameters:
                    generated += int(response.parameters["completion_tokens"])

    start = time.perf_counter()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for i in range(len(texts)):
                nursery.start_soon(one, i)
    return time.perf_counter() - start, generated, ttft


def generate_round(model: TransformersModel, batch: list[list[int]], tokens: int) -> tuple[float, int]:
    ids = torch.tensor(batch, device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        model.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=True,
        )
    return time.perf_counter() - start, tokens * len(batch)


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(
            Path(tmp) / "bench",
            "gpt2",
            width=args.width,
            layers=args.layers,
            std=0.02,
            vocab_size=4096,
            context=1024,
        )
        parameters = {"threads": args.threads, "kv_cache_budget_mb": 4096}
        if args.device:
            parameters["device"] = args.device
        data = {
            "name": "llm",
            "implementation": "transformers",
            "max_batch_size": max(args.streams),
            "parameters": parameters,
        }
        async with actorserve.open_engine([model_settings_from_dict(data, folder=folder)]) as engine:
            model = engine.model("llm")
            assert isinstance(model, TransformersModel)
            size = sum(p.numel() for p in model.model.parameters())
            print(
                f"model: gpt2 {args.layers} layers, width {args.width}, {size / 1e6:.1f} M parameters, "
                f"{model.device} {model.dtype}, {args.threads} thread(s)"
            )
            print(
                f"cache per token {model.token_bytes} B; per sequence of {args.prompt + args.tokens} tokens "
                f"{model.token_bytes * (args.prompt + args.tokens) / 2**20:.2f} MiB"
            )
            print(
                f"{'streams':>7} {'runtime tok/s':>14} {'generate tok/s':>15} {'ratio':>6} {'TTFT p50 ms':>12}"
            )
            for n in args.streams:
                batch = prompts(model.tokenizer, n, args.prompt)
                texts = [model.tokenizer.decode(p) for p in batch]
                best_rt, best_gen, ttft50 = 0.0, 0.0, 0.0
                for _ in range(args.rounds):
                    wall, generated, ttft = await runtime_round(engine, texts, args.tokens)
                    if generated / wall > best_rt:
                        best_rt, ttft50 = generated / wall, statistics.median(ttft) * 1000
                    wall, generated = await trio.to_thread.run_sync(generate_round, model, batch, args.tokens)
                    best_gen = max(best_gen, generated / wall)
                print(f"{n:>7} {best_rt:>14.0f} {best_gen:>15.0f} {best_rt / best_gen:>6.2f} {ttft50:>12.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    trio.run(main, parser.parse_args())
