"""Small models for engine tests: they record what the engine does to them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import attrs
import numpy as np
import trio

from actorserve import (
    BatchModel,
    InferenceRequest,
    InferenceResponse,
    Model,
    ModelSettings,
    SequenceSettings,
    StepOutput,
)
from actorserve.codecs import tensor_from_numpy
from actorserve.model import int_parameter


@attrs.define
class Counter:
    sequence_id: str
    total: int = 0


@attrs.define(eq=False)
class Count:
    request: InferenceRequest
    state: Counter | None
    tokens: int
    emitted: int = 0


class RecordingModel(BatchModel[Counter, Count]):
    """Streams ``n_tokens`` responses per request (``index`` = k, ``total`` = tokens the
    sequence emitted so far). Records the request ids of every step and every hook call.

    ``fail_on`` (request parameter) makes the step raise when that request is in it;
    ``begin_error`` makes ``begin`` raise a RuntimeError (a hook failure).
    """

    default_max_batch_size = 4
    step_in_thread = False  # keeps MockClock autojump from jumping during a step

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.steps: list[list[str]] = []
        self.ended: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.states: list[str] = []

    def new_state(self, sequence_id: str) -> Counter:
        self.states.append(sequence_id)
        return Counter(sequence_id)

    def begin(self, request: InferenceRequest, state: Counter | None) -> Count:
        if request.parameters.get("begin_error"):
            raise RuntimeError("begin exploded")
        return Count(request, state, int_parameter(request, "n_tokens", 1, minimum=0))

    def step(self, batch: list[Count]) -> list[StepOutput]:
        self.steps.append([str(w.request.id) for w in batch])
        if any(w.request.parameters.get("fail_on") for w in batch):
            raise ValueError("step exploded")
        outputs = []
        for work in batch:
            if work.tokens == 0:
                outputs.append(StepOutput(done=True))
                continue
            k = work.emitted
            work.emitted += 1
            total = k + 1
            if work.state is not None:
                work.state.total += 1
                total = work.state.total
            response = self.response(
                work.request,
                [
                    tensor_from_numpy("index", np.array([k], dtype=np.int64)),
                    tensor_from_numpy("total", np.array([total], dtype=np.int64)),
                ],
            )
            outputs.append(StepOutput(response, done=work.emitted >= work.tokens))
        return outputs

    def on_sequence_end(self, state: Counter, reason: str) -> None:
        self.ended.append((state.sequence_id, reason))

    def on_request_cancelled(self, work: Count) -> None:
        self.cancelled.append(str(work.request.id))


class ThreadedRecordingModel(RecordingModel):
    """The same model, stepped in a worker thread like a real model."""

    step_in_thread = True


def recording_settings(name: str = "rec", **overrides: Any) -> ModelSettings:
    sequence = overrides.pop("sequence", SequenceSettings())
    implementation = overrides.pop("implementation", RecordingModel)
    return ModelSettings(name=name, implementation=implementation, sequence=sequence, **overrides)


def request(request_id: str, n_tokens: int = 1, *, model: str = "rec", **parameters: Any) -> InferenceRequest:
    return InferenceRequest(
        inputs=[], id=request_id, parameters={"n_tokens": n_tokens, **parameters}, model_name=model
    )


class GateModel(Model):
    """Streams ``n_tokens`` responses (output ``index`` = k, int64). With parameter
    ``gate`` (a name), it emits ``free`` tokens and then waits for the test to open that
    gate before each further token. Records which requests started and left (and how).

    With a sequence it keeps nothing; it exists to hold requests in flight on demand."""

    default_tokens = 3
    default_free = 1

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.gates: defaultdict[str, trio.Event] = defaultdict(trio.Event)
        self.started: defaultdict[str, trio.Event] = defaultdict(trio.Event)
        self.left: defaultdict[str, trio.Event] = defaultdict(trio.Event)
        self.outcome: dict[str, str] = {}

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            rid = str(request.id)
            n_tokens = int_parameter(request, "n_tokens", self.default_tokens, minimum=0)
            gate = request.parameters.get("gate")
            free = int_parameter(request, "free", self.default_free, minimum=0)
            self.started[rid].set()
            outcome = "cancelled"
            try:
                for k in range(n_tokens):
                    if gate is not None and k >= free:
                        await self.gates[str(gate)].wait()
                    yield self.response(request, [tensor_from_numpy("index", np.array([k], dtype=np.int64))])
                outcome = "done"
            finally:
                self.outcome[rid] = outcome
                self.left[rid].set()
