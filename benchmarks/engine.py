"""Engine benchmark (in-process, no network): continuous batching vs the plain loop,
and memory per idle sequence actor.

    python benchmarks/engine.py [--rounds 3] [--sequences 100000]

Prints tokens/s through the engine with 1, 16 and 64 concurrent `stepper` streams of 64
tokens next to the same [B,1024] chain called in a plain loop (the limit), requests/s of
the accumulator (microsecond steps) stepped inline and in the step-loop thread, and the
memory each idle sequence actor costs beyond its model state.
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")  # one BLAS thread, as the stepper contract says

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

import attrs
import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).parent / "models" / "stepper"))

from stepper import DIM, StepperModel, chain, stepper_weights

import actorserve
from actorserve import InferenceRequest, ModelSettings, SequenceSettings
from actorserve.codecs import tensor_from_numpy
from actorserve.models.accumulator import AccumulatorModel

TOKENS = 64


def plain_loop(batch: int, weights: list[np.ndarray]) -> float:
    """tokens/s of B states stepped together for 64 tokens, no engine."""
    h = np.full((batch, DIM), 0.01, dtype=np.float32)
    start = time.perf_counter()
    for _ in range(TOKENS):
        h = chain(h, weights)
    return batch * TOKENS / (time.perf_counter() - start)


async def through_engine(engine: actorserve.Engine, batch: int) -> float:
    text = np.empty(1, dtype=object)
    text[0] = b"hello"
    counts = [0] * batch

    async def stream(i: int) -> None:
        request = InferenceRequest(
            [tensor_from_numpy("text_input", text, "BYTES")], id=f"b{i}", parameters={"n_tokens": TOKENS}
        )
        async with engine.infer_stream(request, model="stepper") as responses:
            async for _ in responses:
                counts[i] += 1

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(batch):
            nursery.start_soon(stream, i)
    elapsed = trio.current_time() - start
    assert counts == [TOKENS] * batch, counts
    return batch * TOKENS / elapsed


async def throughput(rounds: int) -> None:
    weights = stepper_weights()
    settings = ModelSettings(name="stepper", implementation=StepperModel, max_batch_size=64)
    async with actorserve.open_engine([settings]) as engine:
        await through_engine(engine, 4)  # warm up
        print(f"{'streams':>8} {'engine tok/s':>13} {'plain loop tok/s':>17} {'ratio':>6}")
        for batch in (1, 16, 64):
            best_engine = best_plain = 0.0
            for _ in range(rounds):  # interleaved, best of N: the machine is shared
                best_plain = max(best_plain, plain_loop(batch, weights))
                best_engine = max(best_engine, await through_engine(engine, batch))
            print(f"{batch:>8} {best_engine:>13,.0f} {best_plain:>17,.0f} {best_engine / best_plain:>6.2f}")


class ThreadedAccumulator(AccumulatorModel):
    """The accumulator stepped by the step-loop thread instead of inline."""

    step_in_thread = True


async def accumulator_rate(rounds: int, concurrency: int = 256, per_sequence: int = 8) -> None:
    """requests/s of ``concurrency`` sequences sending ``per_sequence`` requests each,
    for the accumulator stepped inline (its setting) and in the step-loop thread."""
    from actorserve.models import builtin_settings as builtin_models

    accumulator = next(m for m in builtin_models() if m.name == "accumulator")
    one = tensor_from_numpy("INPUT", np.array([1], dtype=np.int64))
    best: dict[str, float] = {}
    for _ in range(rounds):  # interleaved, best of N
        for label, implementation in (("inline", AccumulatorModel), ("thread", ThreadedAccumulator)):
            settings = attrs.evolve(accumulator, implementation=implementation)
            async with actorserve.open_engine([settings]) as engine:

                async def sequence(sid: int, engine: actorserve.Engine = engine) -> None:
                    for k in range(per_sequence):
                        parameters = {
                            "sequence_id": sid,
                            "sequence_start": k == 0,
                            "sequence_end": k == per_sequence - 1,
                        }
                        await engine.infer(
                            InferenceRequest([one], parameters=parameters), model="accumulator"
                        )

                start = trio.current_time()
                async with trio.open_nursery() as nursery:
                    for sid in range(1, concurrency + 1):
                        nursery.start_soon(sequence, sid)
                rate = concurrency * per_sequence / (trio.current_time() - start)
                best[label] = max(best.get(label, 0.0), rate)
    print(
        f"accumulator, {concurrency} sequences x {per_sequence} requests: "
        + ", ".join(f"step {label} {rate:,.0f} req/s" for label, rate in best.items())
    )


async def memory(sequences: int) -> None:
    from actorserve.models import builtin_settings as builtin_models

    accumulator = next(m for m in builtin_models() if m.name == "accumulator")
    accumulator = attrs.evolve(
        accumulator, sequence=SequenceSettings(idle_timeout_ms=3_600_000, max_sequences=sequences + 1)
    )
    zero = tensor_from_numpy("INPUT", np.array([0], dtype=np.int64))
    async with actorserve.open_engine([accumulator]) as engine:
        for i in range(100):  # warm caches before measuring
            await engine.infer(
                InferenceRequest(
                    [zero], parameters={"sequence_id": f"w{i}", "sequence_start": True, "sequence_end": True}
                ),
                model="accumulator",
            )
        gc.collect()
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(sequences):
            await engine.infer(
                InferenceRequest([zero], parameters={"sequence_id": i + 1, "sequence_start": True}),
                model="accumulator",
            )
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert (await engine.statistics("accumulator")).open_sequences == sequences
        model = engine.model("accumulator")
        assert isinstance(model, AccumulatorModel)
        state_bytes = sys.getsizeof(model.new_state("size"))  # what each sequence's state is
        per = (after - before) / sequences
        print(
            f"{sequences:,} open idle sequences: {per:,.0f} B each in all, "
            f"{per - state_bytes:,.0f} B beyond the model state ({state_bytes} B)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=100_000)
    args = parser.parse_args()
    trio.run(throughput, args.rounds)
    trio.run(accumulator_rate, args.rounds)
    trio.run(memory, args.sequences)


if __name__ == "__main__":
    main()
