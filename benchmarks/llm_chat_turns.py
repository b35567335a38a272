"""The ``transformers`` runtime over a 10-turn chat: time to first token of each turn when
the client resends the whole conversation (as every OpenAI chat client does), without and
with the prefix cache, and when it sends only the new turn over a sequence (prints
numbers; not a test).

    python benchmarks/llm_chat_turns.py [--turns 10] [--new 100] [--answer 16]
        [--width 512] [--layers 8] [--threads 1] [--device cpu|cuda] [--rounds 3]

Builds a Llama checkpoint from a config in a temporary folder (width 512, 8 layers, a
4096-token byte-level BPE vocabulary trained on tests/data/tinyshakespeare.txt:
about 30 M parameters, the shape of issue 36's comparison with vLLM; nothing is
downloaded), then runs the same chat three ways through an in-process engine:
- ``resent, no reuse``: each turn sends the whole conversation, ``prefix_cache`` false;
- ``resent, prefix cache``: the same, ``prefix_cache`` true (the default);
- ``sequence``: each turn sends only its new text to one sequence.
Each user turn is ``--new`` tokens of Shakespeare (a different passage per turn), each
answer ``--answer`` tokens, greedy: the three ways read the same tokens and answer the
same text (checked). The three run side by side, turn by turn (a burst of load on a
shared machine falls on all of them alike). TTFT: from sending a turn to its first
streamed text. Per way, the best of ``--rounds`` per turn is printed, with turn 10 /
turn 1 and the sum; and the tokens each way's prefill read per chat (the runtime's
``cache_statistics``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from chat_transcript import SYSTEM, Transcript, user_turns
from support.tiny_llm import build

import actorserve
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.models.llm import TransformersModel
from actorserve.modelsettings import model_settings_from_dict
from actorserve.types import InferenceRequest

TIMEOUT = 1800.0


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


class Chat:
    """One way of sending the chat through ``engine``: its transcript and each turn's TTFT."""

    def __init__(self, engine: Engine, way: str, answer: int) -> None:
        self.engine = engine
        self.answer = answer
        self.transcript = Transcript(sequence=way == "sequence")
        self.times: list[float] = []

    async def turn(self, i: int, text: str, last: bool, name: str) -> None:
        control: dict[str, Any] = {}
        if self.transcript.sequence:
            control = {"sequence_id": name, "sequence_start": i == 0, "sequence_end": last}
        ttft, said = await first_token(self.engine, self.transcript.prompt(text), self.answer, **control)
        self.transcript.answered(text, said)
        self.times.append(ttft)


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    ways = {"resent, no reuse": False, "resent, prefix cache": True, "sequence": True}
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
        async with AsyncExitStack() as stack:
            engines: dict[str, tuple[Engine, TransformersModel]] = {}
            for way, reuse in ways.items():
                parameters: dict[str, Any] = {
                    "threads": args.threads,
                    "kv_cache_budget_mb": 1024,
                    "prefix_cache": reuse,
                }
                if args.device:
                    parameters["device"] = args.device
                data = {"name": "llm", "implementation": "transformers", "parameters": parameters}
                engine = await stack.enter_async_context(
                    actorserve.open_engine([model_settings_from_dict(data, folder=folder)])
                )
                model = engine.model("llm")
                assert isinstance(model, TransformersModel)
                engines[way] = engine, model
            size = sum(p.numel() for p in model.model.parameters())
            print(
                f"model: llama {args.layers} layers, width {args.width}, {size / 1e6:.1f} M parameters, "
                f"{model.device} {model.dtype}, {args.threads} thread(s); {args.turns} turns of "
                f"~{args.new} new tokens, answers of {args.answer} tokens, best of {args.rounds} per turn"
            )
            turns = user_turns(model.tokenizer, args.turns, args.new)
            for engine, _ in engines.values():  # the kernels warm up
                await first_token(engine, SYSTEM + turns[0], 2)
            before = {way: m.cache_statistics().prefilled_tokens for way, (_, m) in engines.items()}
            best: dict[str, list[float]] = {}
            answers: dict[str, list[str]] = {}
            with trio.fail_after(TIMEOUT):
                for r in range(args.rounds):
                    chats = {way: Chat(engine, way, args.answer) for way, (engine, _) in engines.items()}
                    for _, m in engines.values():  # each round starts from an empty prefix cache
                        if m.budget.prefix is not None:
                            with m.budget.lock:
                                m.budget.prefix.drop(2**62)
                    # turn by turn, the ways one after the other: a burst of load on the
                    # shared machine falls on all of them alike
                    for i, text in enumerate(turns):
                        for chat in chats.values():
                            await chat.turn(i, text, i == len(turns) - 1, f"chat{r}")
                    for way, chat in chats.items():
                        times = best.get(way)
                        best[way] = (
                            chat.times
                            if not times
                            else [min(a, b) for a, b in zip(times, chat.times, strict=True)]
                        )
                        answers[way] = chat.transcript.answers
        reference = answers["resent, no reuse"]
        print(
            f"{'way':<22} {'turn 1 ms':>10} {'turn 10 ms':>11} {'10/1':>6} {'sum ms':>8} {'read/chat':>10} same"
        )
        for way, times in best.items():
            read = (engines[way][1].cache_statistics().prefilled_tokens - before[way]) // args.rounds
            last = times[min(9, len(times) - 1)]
            print(
                f"{way:<22} {times[0] * 1000:>10.1f} {last * 1000:>11.1f} {last / times[0]:>6.2f} "
                f"{sum(times) * 1000:>8.0f} {read:>10} {answers[way] == reference}"
            )
        print("per turn (ms): " + "; ".join(f"{w}: {[round(t * 1000) for t in b]}" for w, b in best.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--new", type=int, default=100)
    parser.add_argument("--answer", type=int, default=16)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main, parser.parse_args())
