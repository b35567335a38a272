"""Memory per open sequence of the text models (prints numbers; not a test): the RSS a
process grows by while N sequences are open, divided by N.

    python benchmarks/sequence_memory.py [--sequences 1000] [--prompt 64] [--tokens 16]

Each model runs in a fresh child process (an in-process engine, no transport): 20
sequences opened and ended first (warm-up), then ``--sequences`` sequences each opened
with one request (a ``--prompt``-character prompt, ``--tokens`` tokens generated
greedily) and left open (idle timeout 1 h). RSS is read before and after (both after
``gc.collect()``); the ``transformers`` runtime also reports what its caches hold by its
own count (``cache_bytes``) and a token's keys and values (``token_bytes``).

Models: ``accumulator`` (the baseline: one integer of state), the built-in ``text``
(the character GRU: its hidden state per sequence), and tiny ``transformers``
checkpoints (GPT-2 and Llama, width 64, 2 layers, float32) built here as the tests
build them (``tests/support/tiny_llm.py``; no download). A real checkpoint's KV cache
per token is ``2 x layers x kv_heads x head_dim x bytes``: scale from ``token_bytes``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import psutil
import trio

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("accumulator", "text", "gpt2", "llama")
WARM_UP = 20
#: seconds one model's child gets
CHILD_TIMEOUT = 900.0


def settings_of(model: str, sequences: int, folder: Path) -> Any:
    from actorserve.models import builtin_settings
    from actorserve.modelsettings import model_settings_from_dict
    from actorserve.settings import SequenceSettings

    sequence = SequenceSettings(idle_timeout_ms=3_600_000, max_sequences=sequences + WARM_UP + 1)
    if model in ("accumulator", "text"):
        builtin = next(m for m in builtin_settings() if m.name == model)
        return attrs.evolve(builtin, sequence=sequence)
    sys.path.insert(0, str(ROOT / "tests"))
    from support.tiny_llm import build

    build(folder / model, model, dtype="float32")
    data = {
        "name": model,
        "implementation": "transformers",
        "parameters": {"dtype": "float32", "device": "cpu", "kv_cache_budget_mb": 65536},
        "sequence": {"idle_timeout_ms": 3_600_000, "max_sequences": sequences + WARM_UP + 1},
    }
    return model_settings_from_dict(data, folder=folder / model)


def request(model: str, prompt: int, tokens: int, parameters: dict[str, Any]) -> Any:
    from actorserve import InferenceRequest
    from actorserve.codecs import tensor_from_numpy

    if model == "accumulator":
        tensor = tensor_from_numpy("INPUT", np.array([1], dtype=np.int64))
        return InferenceRequest([tensor], parameters=parameters)
    data = np.empty(1, dtype=object)
    data[0] = ("To be, or not to be: that is the question. " * 8)[:prompt].encode()
    extra = {"max_tokens": tokens, "temperature": 0}
    return InferenceRequest(
        [tensor_from_numpy("text_input", data, "BYTES")], parameters={**parameters, **extra}
    )


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


async def measure(model: str, sequences: int, prompt: int, tokens: int) -> dict[str, Any]:
    import actorserve

    with tempfile.TemporaryDirectory() as tmp:
        settings = settings_of(model, sequences, Path(tmp))
        async with actorserve.open_engine([settings]) as engine:
            for i in range(WARM_UP):
                start_end = {"sequence_id": f"w{i}", "sequence_start": True, "sequence_end": True}
                await engine.infer(request(model, prompt, tokens, start_end), model=model)
            before = rss()
            for i in range(sequences):
                opened = {"sequence_id": f"s{i}", "sequence_start": True}
                await engine.infer(request(model, prompt, tokens, opened), model=model)
            after = rss()
            assert (await engine.statistics(model)).open_sequences == sequences
            result: dict[str, Any] = {
                "model": model,
                "sequences": sequences,
                "rss_per_sequence": (after - before) / sequences,
            }
            instance = engine.model(model)
            if hasattr(instance, "cache_bytes"):
                result["cache_per_sequence"] = instance.cache_bytes() / sequences
                result["token_bytes"] = instance.token_bytes
            return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sequences", type=int, default=1000)
    parser.add_argument("--prompt", type=int, default=64, help="characters of each sequence's prompt")
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated for each")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one model, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(trio.run(measure, args.one, args.sequences, args.prompt, args.tokens)))
        return
    print(f"{args.sequences} open sequences, {args.prompt}-character prompts, {args.tokens} tokens each")
    for model in args.models.split(","):
        command = [sys.executable, __file__, "--one", model, "--sequences", str(args.sequences)]
        command += ["--prompt", str(args.prompt), "--tokens", str(args.tokens)]
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=CHILD_TIMEOUT, cwd=ROOT, check=True
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        line = f"{model:12} RSS {result['rss_per_sequence'] / 1024:8.1f} KiB per open sequence"
        if "cache_per_sequence" in result:
            line += (
                f"; KV cache {result['cache_per_sequence'] / 1024:.1f} KiB per sequence by the runtime's count"
                f" ({result['token_bytes']} B a token)"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
