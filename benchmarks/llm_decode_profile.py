"""Where one batched decode step of the ``transformers`` runtime spends its time, eager
against the inductor-compiled bucketed decode (prints ``torch.profiler`` tables and
the ms per step; not a test).

    python benchmarks/llm_decode_profile.py [--rows 32] [--prompt 128] [--steps 20]
        [--width 512] [--layers 8] [--threads 1] [--dtype float32]

Builds the ~30 M-parameter Llama of ``benchmarks/llm_compile.py`` (random weights, nothing
downloaded), reads ``--rows`` prompts of ``--prompt`` tokens with the runtime's prefill,
then runs ``--steps`` decode steps of the whole batch through the runtime's batch cache
(:mod:`actorserve.models.llm.forward`), eager and then with the compiled decoder
(:mod:`actorserve.models.llm.compiled`, compiled before the timing), and prints the ops
that took the most time of each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.tiny_llm import build

from actorserve.models.llm.compiled import Decoder
from actorserve.models.llm.forward import Batch, new_batch, prefill


class Row:
    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.kv = kv


def steps(model: object, batch: Batch[Row], count: int) -> float:
    """ms per step of ``count`` steps."""
    started = time.perf_counter()
    for _ in range(count):
        batch.step(model, [1] * len(batch.rows))
    return (time.perf_counter() - started) * 1000 / count


def main(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(
            Path(tmp) / "llm", "llama", width=args.width, layers=args.layers, std=0.02, vocab_size=4096
        )
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype).eval()
    device = torch.device("cpu")
    with torch.inference_mode():
        prompt = [[(7 * i + j) % 4000 + 10 for j in range(args.prompt)] for i in range(args.rows)]
        kvs, _ = prefill(model, None, prompt, device)
        rows = [Row(kv) for kv in kvs]
        decoder = Decoder(model, device, "inductor", 0)
        for name, which in (("eager", None), ("compiled", decoder)):
            batch = new_batch(rows, lambda row: row.kv, None, which)
            if which is not None:
                started = time.perf_counter()
                steps(model, batch, 1)  # starts the compile of its bucket
                decoder.close(3600.0)
                print(f"compile: {time.perf_counter() - started:.1f} s", flush=True)
            steps(model, batch, 3)  # warm
            per_step = steps(model, batch, args.steps)
            print(
                f"\n{name}: {args.rows} rows, {per_step:.1f} ms per step ({args.rows * 1000 / per_step:.0f} tok/s)"
            )
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                steps(model, batch, args.steps)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--top", type=int, default=12)
    main(parser.parse_args())
