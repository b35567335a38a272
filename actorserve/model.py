"""The model API: :class:`Model` (MLServer's surface) and :class:`BatchModel`
(continuous batching and per-sequence state).

A plain :class:`Model` runs in the caller's trio task: ``predict`` and ``predict_stream``
are async and must not block (run blocking work with ``trio.to_thread.run_sync``). A
:class:`BatchModel` is driven by the engine's :class:`~actorserve.actors.batcher.ContinuousBatcher`:
``begin`` decodes a request into a unit of work on the trio thread, ``step`` advances a
whole batch of work by one step in a worker thread.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import attrs
import numpy as np

from .api import EndReason, bool_parameter
from .codecs import tensor_from_numpy
from .errors import BadInput, ModelFailed
from .evictions import EvictionRequests
from .settings import ModelSettings
from .textgen import TextGeneration
from .types import InferenceRequest, InferenceResponse, Tensor

StateT = TypeVar("StateT")
_EVICTIONS_LOCK = threading.Lock()
WorkT = TypeVar("WorkT")

#: Why a sequence ended, as passed to :meth:`BatchModel.on_sequence_end` (string values:
#: ``"ended"``, ``"cancelled"``, ``"expired"``, ``"evicted"``, ``"failed"``, ``"shutdown"``).
END_REASONS: tuple[EndReason, ...] = tuple(EndReason)


@attrs.frozen(slots=True)
class StepOutput:
    """What one step produced for one item of the batch.

    ``response`` is streamed to the caller (None: nothing this step, e.g. during a
    prefill chunk). ``done`` takes the item out of the batch after this step. ``error``
    fails this item only (it is then done).
    """

    response: InferenceResponse | None = None
    done: bool = False
    error: Exception | None = None
    #: the item's sequence ends (reason ``ended``) once this item is done, as if its
    #: request had said ``sequence_end`` (a model that decides the end itself).
    end_sequence: bool = False


class Model:
    """A model served by actorserve; subclass and override ``predict`` and/or
    ``predict_stream``.

    ``settings`` is this version's :class:`ModelSettings`; ``parameters`` are its free-form
    ``parameters`` block.
    """

    #: True if ``predict_stream`` consumes several requests of one stream together
    #: (stream-in). Otherwise each request of a stream is served on its own.
    stream_input: ClassVar[bool] = False
    #: The request parameters this model reads. When declared (here or in the settings'
    #: ``request.parameters``), a request with any other parameter is refused with
    #: :class:`BadInput` naming the known ones (the sequence and transport parameters
    #: always pass). None: not declared, every parameter passes.
    request_parameters: ClassVar[frozenset[str] | None] = None
    #: How this model generates text (:mod:`actorserve.textgen`), so that the text front
    #: doors (the OpenAI API) serve it; the settings' ``text_generation`` block is laid
    #: over it. None: not a text generator (unless the settings say so).
    text_generation: ClassVar[TextGeneration | None] = None
    #: The ``parameters`` keys a load request's ``parameters.config`` may set for this
    #: model: only those that name no code, file, URL or environment variable (see
    #: :mod:`actorserve.engine.overrides`). Any other is refused unless the operator allows it.
    overridable_parameters: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str:
        return self.settings.version

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.settings.parameters)

    @property
    def step_timeout(self) -> float | None:
        """Seconds a step (a plain model: the wait for its next response) may take
        before the engine gives up on it (the settings' ``step_timeout``); None: no
        deadline. A model that enforces a deadline of its own returns None."""
        return self.settings.step_timeout or None

    async def load(self) -> None:
        """Load weights etc. Called once before the model serves."""

    async def unload(self) -> None:
        """Free what ``load`` took (threads, files). Called once when the model version
        stops (unloaded, replaced, or the server shuts down), after its last step."""

    def kv_cache_usage(self) -> float | None:
        """KV cache in use, 0..1, or None; cheap, never waits (docs/writing-a-model.md)."""
        return None

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        """One response for one request; the default collects ``predict_stream``."""
        if type(self).predict_stream is Model.predict_stream:
            raise NotImplementedError(f"{type(self).__name__} implements neither predict nor predict_stream")
        responses = [r async for r in self.predict_stream(_one(request))]
        return merge_responses(self, request, responses)

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        """Responses for a stream of requests; the default answers each with ``predict``."""
        async for request in requests:
            yield await self.predict(request)

    def response(
        self,
        request: InferenceRequest,
        outputs: Sequence[Tensor],
        parameters: dict[str, Any] | None = None,
    ) -> InferenceResponse:
        """A response to ``request`` with this model's name and version and the request id."""
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=request.id,
            outputs=list(outputs),
            parameters=parameters if parameters is not None else {},
        )

    def metadata(self) -> dict[str, Any]:
        """OIP model metadata (inputs/outputs come from the settings)."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.settings.platform or f"actorserve/{type(self).__name__}",
            "inputs": [
                {"name": s.name, "datatype": s.metadata_datatype, "shape": list(s.shape)}
                for s in self.settings.inputs
            ],
            "outputs": [
                {"name": s.name, "datatype": s.metadata_datatype, "shape": list(s.shape)}
                for s in self.settings.outputs
            ],
        }


class BatchModel(Model, Generic[StateT, WorkT]):
    """A model whose work is stepped in batches by the engine.

    The engine calls, for a sequence: ``new_state`` once when it starts, ``begin`` for
    each of its requests (with the state), ``on_sequence_end`` exactly once when it ends;
    for a request without a sequence, ``begin(request, None)``. ``step`` runs in the
    replica's step-loop thread (one long-lived thread per replica, so every step of a
    replica runs on the same thread) and must return one :class:`StepOutput` per item, in
    order; the state objects reached through the work are touched only there while the
    work is in the batch. ``on_request_cancelled`` is told, on the event loop's thread and
    after the work left the batch, when a caller went away before its work was done.
    """

    #: used when the settings leave max_batch_size at 0.
    default_max_batch_size: ClassVar[int] = 16
    #: True when every request must belong to a sequence.
    requires_sequence: ClassVar[bool] = False
    #: Run ``step`` in the replica's step-loop thread (the default: the event loop stays
    #: responsive during a real model's step, and steps follow each other without
    #: waiting for it). Set False for steps of a few microseconds, where handing each
    #: step's outputs between threads costs more than the step: the batcher's trio task
    #: then steps inline.
    step_in_thread: ClassVar[bool] = True
    #: Let a sequence's next request join the batch once the running one has streamed
    #: its first response (TorchServe's continuous batching: a request may end or
    #: cancel a stream of its own sequence). Requests still start in order, one at a
    #: time; the sequence is idle only when none of its requests runs.
    sequence_overlap: ClassVar[bool] = False
    #: When ``step`` raises for a batch of several items, step each item alone to find
    #: the ones that raise and fail only those (the others go on). This re-runs the
    #: step for the items that did not raise, so a ``step`` that raises must leave the
    #: work and state it was given unchanged (raise before changing anything, or undo).
    #: Set False if it cannot: then a raising step fails every item of its batch.
    isolate_failures: ClassVar[bool] = True

    @property
    def max_batch_size(self) -> int:
        return self.settings.max_batch_size or self.default_max_batch_size

    def new_state(self, sequence_id: str) -> StateT:
        """The initial state of a new sequence."""
        return None  # type: ignore[return-value]

    async def prepare(self, request: InferenceRequest, state: StateT | None) -> None:
        """Work :meth:`begin` will need, done first and off the event loop. ``begin`` runs
        on the event loop, so a part of it that takes time (a tokenizer) belongs here, in
        ``trio.to_thread.run_sync``; the engine awaits this just before ``begin`` with the
        same request and state (a sequence's state is its own meanwhile). Raise
        :class:`BadInput` as ``begin`` would. Default: nothing."""

    def begin(self, request: InferenceRequest, state: StateT | None) -> WorkT:
        """Decode ``request`` into work; raise :class:`BadInput` for bad requests."""
        raise NotImplementedError

    def step(self, batch: list[WorkT]) -> list[StepOutput]:
        """Advance every work item by one step (runs in the replica's step-loop thread)."""
        raise NotImplementedError

    def on_sequence_end(self, state: StateT, reason: EndReason) -> None:
        """A sequence ended (see :data:`END_REASONS`; a ``StrEnum``, so comparing it
        with ``"expired"`` works); free its state."""

    def on_request_cancelled(self, work: WorkT) -> None:
        """The caller of ``work`` went away before it was done."""

    def evict_sequence(self, sequence_id: str, why: str) -> bool:
        """Ask the engine to end the sequence ``sequence_id`` with reason ``evicted``
        (e.g. its cache no longer fits a memory budget). Callable from ``begin`` and
        ``step`` (any thread); the engine acts soon after, on the event loop: if the
        sequence is still open and idle, it ends it, ``on_sequence_end(state,
        "evicted")`` runs, its ``max_sequences`` slot frees and its next request gets a
        404 ``sequence 'x' was evicted (<why>)``. A sequence that is busy by then is left
        open (ask again when its next request begins). False: too many requests wait
        (:data:`~actorserve.evictions.MAX_PENDING_EVICTIONS`); ask again later."""
        return self.evictions.add(sequence_id, why)

    @property
    def evictions(self) -> EvictionRequests:
        """The eviction requests waiting for the engine (see :meth:`evict_sequence`)."""
        requests: EvictionRequests | None = self.__dict__.get("_evictions")
        if requests is None:
            with _EVICTIONS_LOCK:  # created once, whichever thread asks first
                requests = self.__dict__.setdefault("_evictions", EvictionRequests())
        return requests

    def merge(self, request: InferenceRequest, responses: list[InferenceResponse]) -> InferenceResponse:
        """Unary answer from a stream's responses (default: concatenate along axis 0)."""
        return merge_responses(self, request, responses)

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        responses = [r async for r in self.predict_stream(_one(request))]
        return self.merge(request, responses)

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        """Serve requests one by one without the engine (no batching, fresh state each)."""
        import trio

        async for request in requests:
            await self.prepare(request, None)
            work = self.begin(request, None)
            while True:
                if self.step_in_thread:
                    (out,) = await trio.to_thread.run_sync(self.step, [work])
                else:
                    await trio.lowlevel.checkpoint()
                    (out,) = self.step([work])
                if out.error is not None:
                    raise out.error
                if out.response is not None:
                    yield out.response
                if out.done:
                    break


async def _one(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


def merge_responses(
    model: Model, request: InferenceRequest, responses: list[InferenceResponse]
) -> InferenceResponse:
    """Concatenate streamed responses into one (outputs joined along axis 0)."""
    if len(responses) == 1:
        return responses[0]
    if not responses:
        return model.response(request, [])
    names: dict[str, list[Tensor]] = {}
    for resp in responses:
        for tensor in resp.outputs:
            names.setdefault(tensor.name, []).append(tensor)
    outputs = []
    for name, parts in names.items():
        datatype = parts[0].datatype
        try:
            data = np.concatenate(
                [p.data.reshape((-1, *p.shape[1:])) if p.shape else p.data.reshape(1) for p in parts]
            )
        except ValueError as exc:
            raise ModelFailed(f"cannot merge streamed output {name!r}: {exc}") from None
        outputs.append(tensor_from_numpy(name, data, datatype))
    last = responses[-1]
    return InferenceResponse(
        model_name=last.model_name,
        model_version=last.model_version,
        id=last.id,
        outputs=outputs,
        parameters=dict(last.parameters),
    )


# -- request parameters -------------------------------------------------------------


def _bad(name: str, value: object, expected: str) -> BadInput:
    return BadInput(f"parameter {name!r}: expected {expected}, got {value!r}")


def int_parameter(
    request: InferenceRequest,
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """An integer request parameter (numeric strings accepted), range-checked."""
    value = request.parameters.get(name, default)
    if isinstance(value, bool):
        raise _bad(name, value, "an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise _bad(name, value, "an integer") from None
    if not isinstance(value, int):
        raise _bad(name, value, "an integer")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise _bad(name, value, f"an integer {_range(minimum, maximum)}")
    return value


def float_parameter(
    request: InferenceRequest,
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """A numeric request parameter (numeric strings accepted), range-checked."""
    value = request.parameters.get(name, default)
    if isinstance(value, bool):
        raise _bad(name, value, "a number")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _bad(name, value, "a number") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(name, value, "a finite number")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise _bad(name, value, f"a number {_range(minimum, maximum)}")
    return float(value)


def _range(minimum: float | None, maximum: float | None) -> str:
    """``in [0, 10]``, ``>= 0.0`` or ``<= 10``: a bound that is not there is not shown."""
    if minimum is None:
        return f"<= {maximum}"
    if maximum is None:
        return f">= {minimum}"
    return f"in [{minimum}, {maximum}]"


def text_input(request: InferenceRequest, name: str, default: str | None = None) -> str:
    """The first element of a BYTES input as text (``default`` if the input is absent)."""
    tensor = request.input(name, required=default is None)
    if tensor is None:
        assert default is not None
        return default
    if tensor.datatype != "BYTES" or tensor.data.size < 1:
        raise BadInput(f"input {name!r}: expected BYTES with at least one element")
    value = tensor.data.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


__all__ = [
    "END_REASONS",
    "BatchModel",
    "EndReason",
    "Model",
    "StepOutput",
    "bool_parameter",
    "float_parameter",
    "int_parameter",
    "merge_responses",
    "text_input",
]
