"""Models that break on purpose, for the model-fault tests (tests/reliability/
test_rel_model_faults*.py) and the soak (benchmarks/reliability/model_faults.py).

A request chooses its fault with the parameter ``fault``:

- ``raise``: the step (or predict) raises for this item only;
- ``hang``: the step sleeps ``hang`` seconds (default 30) before answering;
- ``count``: the step returns one output too few (the whole batch's fault);
- ``notstep``: this item's output is not a StepOutput;
- ``dtype`` / ``shape`` / ``bytes`` / ``params`` / ``notresponse``: this item's response
  is malformed (FP32 data of another dtype, a shape that does not fit its data, a BYTES
  element that is None, a parameter no encoder can carry, not an InferenceResponse);
- ``leak``: the model keeps ``leak_kb`` KiB (default 256) for ever, per request;
- ``at``: the BatchModel's fault strikes at this step of the request (default 1: its
  first), after ``at - 1`` good responses;
- anything else (or none): ``n`` good responses (default 2), one per step, each with
  ``k`` (its index) and ``replica`` (which replica made it).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import numpy as np
import trio

from actorserve import BatchModel, InferenceRequest, InferenceResponse, Model, StepOutput
from actorserve.codecs import tensor_from_numpy
from actorserve.model import float_parameter, int_parameter
from actorserve.settings import ModelSettings
from actorserve.types import Tensor

_replicas = itertools.count()

#: Memory held by ``leak`` requests, per model instance (freed when it is dropped).
LEAK_PARAMETER = "leak_kb"


#: (sequence id, reason) of every sequence ended, in order, over every instance
ENDED: list[tuple[str, str]] = []
#: the replica number of every FaultyBatchModel unloaded, in order
UNLOADED: list[int] = []


@attrs.define(eq=False)
class Seq:
    """A sequence's state: the steps its requests took, in order."""

    id: str
    steps: list[int] = attrs.field(factory=list)


@attrs.define(eq=False)
class Work:
    request: InferenceRequest
    fault: str
    n: int
    hang: float
    at: int = 1
    k: int = 0
    state: Seq | None = None

    def faulty(self, fault: str) -> bool:
        """This step is where this work's ``fault`` strikes."""
        return self.fault == fault and self.k + 1 >= self.at


def _fault(request: InferenceRequest) -> str:
    value = request.parameters.get("fault", "")
    return value if isinstance(value, str) else ""


def good(model: Model, request: InferenceRequest, k: int, replica: int) -> InferenceResponse:
    return model.response(
        request,
        [
            tensor_from_numpy("k", np.array([k], dtype=np.int64)),
            tensor_from_numpy("replica", np.array([replica], dtype=np.int64)),
        ],
    )


def malformed(model: Model, request: InferenceRequest, fault: str) -> Any:
    """A response broken the way ``fault`` says (None: ``fault`` is not a malformation)."""
    if fault == "notresponse":
        return {"outputs": []}
    if fault == "params":  # no encoder can carry a set
        return model.response(request, [], parameters={"bad": {1, 2}})
    if fault == "dtype":
        tensor = Tensor("y", (2,), "FP32", np.array(["a", "b"], dtype=object))
    elif fault == "shape":
        tensor = Tensor("y", (3,), "FP32", np.zeros(2, dtype=np.float32))
    elif fault == "bytes":
        tensor = Tensor("y", (1,), "BYTES", np.array([None], dtype=object))
    else:
        return None
    return model.response(request, [tensor])


class FaultyBatchModel(BatchModel[Seq, Work]):
    """A BatchModel stepped in its replica's thread that breaks per item as each
    request's ``fault`` says. A sequence's state counts the steps of its requests
    (``on_sequence_end`` records the reason in :data:`ENDED`), so a step run twice
    would show."""

    default_max_batch_size = 8
    request_parameters = frozenset({"fault", "n", "hang", "at", LEAK_PARAMETER})

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.replica = next(_replicas)
        self.loaded = True  # until unload: then nothing may use this instance
        self.leaked: list[bytes] = []

    def new_state(self, sequence_id: str) -> Seq:
        if not self.loaded:
            raise RuntimeError(f"new_state on replica {self.replica}, which was unloaded")
        return Seq(sequence_id)

    def begin(self, request: InferenceRequest, state: Seq | None) -> Work:
        if not self.loaded:
            raise RuntimeError(f"begin on replica {self.replica}, which was unloaded")
        fault = _fault(request)
        if fault == "begin":
            raise RuntimeError(f"begin broke on {request.id}")
        n = int_parameter(request, "n", 2, minimum=1, maximum=1000)
        hang = float_parameter(request, "hang", 30.0, minimum=0)
        at = int_parameter(request, "at", 1, minimum=1)
        return Work(request, fault, n, hang, at, state=state)

    def step(self, batch: list[Work]) -> list[StepOutput]:
        # The contract of isolate_failures: raise before changing any work or state.
        for work in batch:
            if work.faulty("raise"):
                raise RuntimeError(f"step broke on {work.request.id}")
        for work in batch:
            if work.faulty("hang"):
                time.sleep(work.hang)
        outputs = []
        for work in batch:
            fault = work.fault if work.k + 1 >= work.at else ""
            if fault == "notstep":
                outputs.append("not a step output")
                continue
            bad = malformed(self, work.request, fault)
            if bad is not None:
                outputs.append(StepOutput(bad, done=True))
                continue
            if fault == "leak":
                kb = int_parameter(work.request, LEAK_PARAMETER, 256, minimum=1)
                self.leaked.append(np.ones(kb * 1024, dtype=np.uint8).tobytes())
            work.k += 1
            if work.state is not None:
                work.state.steps.append(work.k)
            outputs.append(StepOutput(good(self, work.request, work.k, self.replica), done=work.k >= work.n))
        if any(w.faulty("count") for w in batch):
            outputs.pop()
        return outputs

    def on_sequence_end(self, state: Seq, reason: str) -> None:
        ENDED.append((state.id, str(reason)))

    async def unload(self) -> None:
        UNLOADED.append(self.replica)
        self.loaded = False
        self.leaked.clear()


class InlineFaultyBatchModel(FaultyBatchModel):
    """The same, stepped on the event loop (``step_in_thread = False``)."""

    step_in_thread = False


class FaultyModel(Model):
    """A plain Model: ``predict_stream`` streams ``n`` good responses (default 2), then
    breaks as ``fault`` says: ``raise``; ``hang`` (awaits ``hang`` s on trio's clock);
    ``thread`` (sleeps ``hang`` s in a thread it lets trio abandon); a malformation."""

    request_parameters = frozenset({"fault", "n", "hang"})

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            fault = _fault(request)
            n = int_parameter(request, "n", 2, minimum=0, maximum=1000)
            hang = float_parameter(request, "hang", 30.0, minimum=0)
            for k in range(1, n + 1):
                yield good(self, request, k, -1)
            if fault == "raise":
                raise RuntimeError(f"predict broke on {request.id}")
            if fault == "hang":
                await trio.sleep(hang)
            elif fault == "thread":
                await trio.to_thread.run_sync(time.sleep, hang, abandon_on_cancel=True)
            elif fault == "inline":
                time.sleep(hang)  # noqa: ASYNC251 (the fault: it blocks the event loop)
            bad = malformed(self, request, fault)
            if bad is not None:
                yield bad


class StreamInFaultyModel(Model):
    """Stream in (``stream_input``): one good response per request, then, for a request
    whose ``fault`` is a malformation, that malformed answer."""

    stream_input = True

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        k = 0
        async for request in requests:
            k += 1
            yield good(self, request, k, -1)
            bad = malformed(self, request, _fault(request))
            if bad is not None:
                yield bad


def fault_models(step_timeout: float = 60.0, **overrides: Any) -> tuple[ModelSettings, ...]:
    """``faulty`` (2 threaded replicas), ``faulty_inline``, ``faulty_plain``, and
    ``leaky`` (one replica, recycled every 5 requests)."""
    return (
        ModelSettings(name="leaky", implementation=FaultyBatchModel, max_requests_per_replica=5),
        ModelSettings(
            name="faulty", implementation=FaultyBatchModel, workers=2, step_timeout=step_timeout, **overrides
        ),
        ModelSettings(name="faulty_inline", implementation=InlineFaultyBatchModel, step_timeout=step_timeout),
        ModelSettings(name="faulty_plain", implementation=FaultyModel, step_timeout=step_timeout),
        ModelSettings(name="faulty_streamin", implementation=StreamInFaultyModel, step_timeout=step_timeout),
    )
