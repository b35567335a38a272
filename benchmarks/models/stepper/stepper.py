"""``stepper``: the streamer's contract plus a real per-token cost that batches well.

Each stream keeps ``h`` FP32 [1,1024] (0.01 everywhere at start) and before each token does
``h = tanh(h @ W_i)`` for i = 1..4 with fixed weights
``numpy.random.default_rng(i).standard_normal((1024, 1024), dtype=float32) / 32``. As a
BatchModel the steps of B active streams run as one [B,1024] chain.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from actorserve import BatchModel, InferenceRequest, StepOutput
from actorserve.model import int_parameter, text_input
from actorserve.types import Tensor

DIM = 1024
LAYERS = 4


def stepper_weights() -> list[npt.NDArray[np.float32]]:
    return [
        (np.random.default_rng(i).standard_normal((DIM, DIM), dtype=np.float32) / 32).astype(np.float32)
        for i in range(1, LAYERS + 1)
    ]


def chain(h: npt.NDArray[np.float32], weights: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    """One token for every row of ``h`` [B,1024]."""
    for w in weights:
        h = np.tanh(h @ w)
    return h


class Stream:
    __slots__ = ("emitted", "h", "prompt", "request", "tokens")

    def __init__(self, request: InferenceRequest, prompt: str, tokens: int) -> None:
        self.request = request
        self.prompt = prompt
        self.tokens = tokens
        self.emitted = 0
        self.h = np.full((1, DIM), 0.01, dtype=np.float32)


class StepperModel(BatchModel[None, Stream]):
    default_max_batch_size = 64

    async def load(self) -> None:
        self.weights = stepper_weights()

    def begin(self, request: InferenceRequest, state: None) -> Stream:
        prompt = text_input(request, "text_input", default="tok")
        return Stream(request, prompt, int_parameter(request, "n_tokens", 5, minimum=0, maximum=100_000))

    def step(self, batch: list[Stream]) -> list[StepOutput]:
        active = [s for s in batch if s.emitted < s.tokens]
        if active:
            h = chain(np.concatenate([s.h for s in active]), self.weights)
            for i, stream in enumerate(active):
                stream.h = h[i : i + 1]
        outputs = []
        for stream in batch:
            if stream.emitted >= stream.tokens:  # n_tokens=0
                outputs.append(StepOutput(done=True))
                continue
            k = stream.emitted
            stream.emitted += 1
            text = np.empty(1, dtype=object)
            text[0] = f"{stream.prompt}:{k}".encode()
            response = self.response(
                stream.request,
                [
                    Tensor("text_output", (1,), "BYTES", text),
                    Tensor("index", (1,), "INT64", np.array([k], dtype=np.int64)),
                ],
            )
            outputs.append(StepOutput(response, done=stream.emitted >= stream.tokens))
        return outputs
