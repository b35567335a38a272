"""``matmul`` / ``matmul_batched``: a fixed compute cost per row, for batching benchmarks.

Input ``x`` FP32 [B,1024] -> output ``y`` FP32 [B,16] = the first 16 columns of
``x @ W1 @ W2 @ W3 @ W4`` with ``W_i = numpy.random.default_rng(i).standard_normal((1024,
1024), dtype=float32) / 32``. :class:`MatmulModel` computes each request on its own;
:class:`MatmulBatchedModel` lets the engine merge concurrent requests into one call
(``max_batch_size`` / ``max_batch_time`` in its settings).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt
import trio

from ..errors import BadInput
from ..model import BatchModel, Model, StepOutput
from ..types import InferenceRequest, InferenceResponse, Tensor

DIM = 1024
OUT = 16


def weights() -> list[npt.NDArray[np.float32]]:
    return [
        (np.random.default_rng(i).standard_normal((DIM, DIM), dtype=np.float32) / 32).astype(np.float32)
        for i in range(1, 5)
    ]


def forward(x: npt.NDArray[np.float32], ws: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    for w in ws:
        x = x @ w
    return np.ascontiguousarray(x[:, :OUT])


def _rows(request: InferenceRequest) -> npt.NDArray[np.float32]:
    x = request.input("x")
    assert x is not None
    if x.datatype != "FP32" or len(x.shape) != 2 or x.shape[1] != DIM:
        raise BadInput(f"input 'x': expected FP32 [B,{DIM}], got {x.datatype} {list(x.shape)}")
    return x.data


class MatmulModel(Model):
    """One request, one computation (~1.5 ms). The model parameter ``compute`` says where:
    ``"inline"`` (default: on the event loop, measured fastest for work this short, see
    docs/writing-a-model.md) or ``"thread"`` (a worker thread, one call at a time per
    replica, so the event loop stays free during the call)."""

    overridable_parameters: ClassVar[frozenset[str]] = frozenset({"compute"})

    async def load(self) -> None:
        self.ws = weights()
        self.limiter = trio.CapacityLimiter(1)
        self.inline = self.parameters.get("compute", "inline") == "inline"

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        x = _rows(request)
        if self.inline:
            y = forward(x, self.ws)
        else:
            y = await trio.to_thread.run_sync(forward, x, self.ws, limiter=self.limiter)
        return self.response(request, [Tensor("y", y.shape, "FP32", y)])


class MatmulBatchedModel(BatchModel[None, InferenceRequest]):
    """Concurrent requests are stacked into one [sum(B),1024] computation per step."""

    default_max_batch_size = 32

    async def load(self) -> None:
        self.ws = weights()

    def begin(self, request: InferenceRequest, state: None) -> InferenceRequest:
        _rows(request)  # validate on the event loop, before batching
        return request

    def step(self, batch: list[InferenceRequest]) -> list[StepOutput]:
        xs = [_rows(r) for r in batch]
        y = forward(np.concatenate(xs), self.ws)
        outputs = []
        start = 0
        for request, x in zip(batch, xs, strict=True):
            part = y[start : start + len(x)]
            start += len(x)
            outputs.append(
                StepOutput(self.response(request, [Tensor("y", part.shape, "FP32", part)]), done=True)
            )
        return outputs
