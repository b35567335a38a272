"""The ``transformers`` runtime over a 10-turn chat: time to first token of each turn when
the client resends the whole conversation (as every OpenAI chat client does), without and
with the prefix cache, and when it sends only the new turn over a sequence (prints
numbers; not a test).

    python benchmarks/llm_chat_turns.py [--turns 10] [--new 100] [--answer 16]
        [--width 512] [--layers 8] [--threads 1] [--device cpu|cuda] [--rounds 2]

Builds a Llama checkpoint from a config in a temporary folder (width 512, 8 layers, a
4096-token byte-level BPE vocabulary trained on ../shared/data/tinyshakespeare.txt:
about 30 M parameters, the shape of issue 36's comparison with vLLM; nothing is
downloaded), then runs the same chat three ways through an in-process engine:
- ``resent, no reuse``: each turn sends the whole conversation, ``prefix_cache`` false;
- ``resent, prefix cache``: the same, ``prefix_cache`` true (the default);
- ``sequence``: each turn sends only its new text to one sequence.
Each user turn is ``--new`` tokens of Shakespeare (a different passage per turn), each
answer ``--answer`` tokens, greedy: the three ways read the same tokens and answer the
same text (checked). TTFT: from sending a turn to its first streamed text. Per way, the
best of ``--rounds`` per turn is printed, with turn 10 / turn 1 and the sum; and the
tokens each way's prefill read in all (the runtime's ``cache_statistics``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.tiny_llm import DATA, build

import actorserve
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.models.llm import TransformersModel
from actorserve.modelsettings import model_settings_from_dict
from actorserve.types import InferenceRequest

TIMEOUT = 1800.0
SYSTEM = "system: You are a player in a company of actors. Answer in verse.\n"


def user_turns(tokenizer: Any, turns: int, new: int) -> list[str]:
    """``turns`` passages of about ``new`` tokens each, one per turn."""
    ids: list[int] = tokenizer(DATA.read_text()[:200_000])["input_ids"]
    step = max(new, (len(ids) - new) // max(1, turns))
    return [str(tokenizer.decode(ids[i * step : i * step + new - 6])) for i in range(turns)]


async def first_token(engine: Engine, text: str, answer: int, **parameters: Any) -> tuple[float, str]:
    """TTFT in seconds and the whole answer of one turn."""
    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    params = {"max_tokens": answer, "temperature": 0, **parameters}
    request = InferenceRequest([tensor_from_numpy("text_input", data, "BYTES")], parameters=params)
    pieces: list[str] = []
    sent = time.perf_counter()
    ttft = 0.0
    async with engine.infer_stream(request, model="llm") as responses:
        async for response in responses:
            piece = response.outputs[0].data[0].decode()
            if piece and not ttft:
                ttft = time.perf_counter() - sent
            pieces.append(piece)
    return ttft, "".join(pieces)


async def chat(
    engine: Engine, turns: list[str], answer: int, way: str, name: str
) -> tuple[list[float], list[str]]:
    """One chat: each turn's TTFT and answer."""
    history = SYSTEM
    times: list[float] = []
    answers: list[str] = []
    for i, turn in enumerate(turns):
        new = f"user: {turn}\nassistant:"
        if way == "sequence":
            control = {"sequence_id": name, "sequence_start": i == 0, "sequence_end": i == len(turns) - 1}
            ttft, said = await first_token(engine, (history if i == 0 else "\n") + new, answer, **control)
        else:
            ttft, said = await first_token(engine, history + new, answer)
        history += new + said + "\n"
        times.append(ttft)
        answers.append(said)
    return times, answers


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(
            Path(tmp) / "bench",
            "llama",
            width=args.width,
            layers=args.layers,
            std=0.02,
            vocab_size=4096,
            context=4096,
        )
        ways = {"resent, no reuse": False, "resent, prefix cache": True, "sequence": True}
        results: dict[str, tuple[list[float], list[str], int]] = {}
        for way, reuse in ways.items():
            parameters: dict[str, Any] = {
                "threads": args.threads,
                "kv_cache_budget_mb": 1024,
                "prefix_cache": reuse,
            }
            if args.device:
                parameters["device"] = args.device
            data = {"name": "llm", "implementation": "transformers", "parameters": parameters}
            with trio.fail_after(TIMEOUT):
                async with actorserve.open_engine([model_settings_from_dict(data, folder=folder)]) as engine:
                    model = engine.model("llm")
                    assert isinstance(model, TransformersModel)
                    if not results:
                        size = sum(p.numel() for p in model.model.parameters())
                        print(
                            f"model: llama {args.layers} layers, width {args.width}, {size / 1e6:.1f} M parameters, "
                            f"{model.device} {model.dtype}, {args.threads} thread(s); {args.turns} turns of "
                            f"~{args.new} new tokens, answers of {args.answer} tokens, best of {args.rounds}"
                        )
                    turns = user_turns(model.tokenizer, args.turns, args.new)
                    await chat(engine, turns[:1], 2, "resent", "warm")  # the kernels warm up
                    before = model.cache_statistics().prefilled_tokens
                    best: list[float] = []
                    answers: list[str] = []
                    for r in range(args.rounds):
                        if reuse and way != "sequence":  # each round starts from an empty cache
                            assert model.budget.prefix is not None
                            with model.budget.lock:
                                model.budget.prefix.drop(2**62)
                        times, answers = await chat(engine, turns, args.answer, way, f"chat{r}")
                        best = times if not best else [min(a, b) for a, b in zip(best, times, strict=True)]
                    read = (model.cache_statistics().prefilled_tokens - before) // args.rounds
                    results[way] = (best, answers, read)
        reference = results["resent, no reuse"][1]
        print(
            f"{'way':<22} {'turn 1 ms':>10} {'turn 10 ms':>11} {'10/1':>6} {'sum ms':>8} {'read/chat':>10} same"
        )
        for way, (best, answers, read) in results.items():
            last = best[min(9, len(best) - 1)]
            print(
                f"{way:<22} {best[0] * 1000:>10.1f} {last * 1000:>11.1f} {last / best[0]:>6.2f} "
                f"{sum(best) * 1000:>8.0f} {read:>10} {answers == reference}"
            )
        print(
            "per turn (ms): "
            + "; ".join(f"{w}: {[round(t * 1000) for t in r[0]]}" for w, r in results.items())
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--new", type=int, default=100)
    parser.add_argument("--answer", type=int, default=16)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    trio.run(main, parser.parse_args())
