"""The engine boundary: what the transports may know about the engine.

Every front door (REST, gRPC, and any later one) is typed against :class:`EngineAPI`
and the records below, never against the actors. Two classes implement it: the
in-process :class:`actorserve.engine.Engine` and, in the multi-process server, a client
that talks to the engine process over a socket. So every method is ``async`` (a client
may need a round trip) and every value that crosses it is a plain frozen record.

A request's controls (sequence, owner, priority, timeout) are one
:class:`RequestControl` record on the request, filled once by each door's wire module
(:mod:`.controls`, re-exported here).

Each unary (management) method is written once, here, labelled ``@unary("Record")``:
its signature is the one source of its record (a :class:`UnaryCall`, which
:meth:`EngineAPI.call` runs) and of the engine client's named method, both written
from it by ``python -m actorserve.unarygen`` (:mod:`actorserve.unary` says why).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, runtime_checkable

import attrs

from .controls import (
    ANY_ID_LENGTH,
    MAX_SEQUENCE_ID_LENGTH,
    OWNER_PARAMETER,
    RequestControl,
    bool_parameter,
    control_of,
    no_sequence_id,
    no_sequence_text,
    with_control,
)
from .descriptions import (
    BatchStatistics,
    Duration,
    InferenceStatistics,
    ModelDescription,
    ReplicaDescription,
)
from .textgen import TextGeneration
from .types import SEQUENCE_PARAMETERS, InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from .rawevents import RawEvent

T = TypeVar("T")
M = TypeVar("M", bound=Callable[..., Awaitable[Any]])


class UnaryCall(Generic[T]):
    """A typed request for one unary engine method, whose answer is a ``T``: the records
    are in :mod:`actorserve.unary_records`, the table that runs them in
    :mod:`actorserve.unary`; pass one to :meth:`EngineAPI.call`. (The base lives here so
    the boundary can name it.)"""

    __slots__ = ()


@attrs.frozen
class Unary:
    """What ``@unary`` says of an :class:`EngineAPI` method (see :func:`unary`)."""

    #: the name of the record that carries a call of it (``Unload``)
    record: str
    #: a front may keep the answer until the engine pushes ``ModelsChanged`` (the
    #: answers asked before every gRPC stream message, OpenAI completion and REST
    #: ``text_input`` generate; the engine's ``Watchers`` fire whenever one may change)
    remembered: bool = False


def unary(record: str, *, remembered: bool = False) -> Callable[[M], M]:
    """Mark an :class:`EngineAPI` method as a unary call, answered once and carried by the
    record named ``record``. The method stays as written (this only labels it);
    ``python -m actorserve.unarygen`` writes the record and the engine client's method
    from its signature (:mod:`actorserve.unary`)."""

    def label(method: M) -> M:
        if unary_of(method) is not None:  # two labels: one would be silently lost
            raise TypeError(f"{method.__name__} is labelled @unary twice")
        setattr(method, UNARY_LABEL, Unary(record, remembered))
        return method

    return label


#: the attribute :func:`unary` labels a method with
UNARY_LABEL: Final = "__unary__"


def unary_of(method: object) -> Unary | None:
    """What ``@unary`` said of ``method``; None for a method it does not label."""
    label = getattr(method, UNARY_LABEL, None)
    return label if isinstance(label, Unary) else None


class ModelState(enum.StrEnum):
    """A model version's state, with Triton's names (the repository index shows them)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class EndReason(enum.StrEnum):
    """Why a sequence ended (passed to :meth:`BatchModel.on_sequence_end`).

    A ``StrEnum``: ``reason == "expired"`` works for models written against strings."""

    ENDED = "ended"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    EVICTED = "evicted"
    FAILED = "failed"
    SHUTDOWN = "shutdown"

    @property
    def phrase(self) -> str:
        """How a client is told: ``sequence 'x' <phrase>``."""
        return _PHRASES[self]


_PHRASES: dict[EndReason, str] = {
    EndReason.ENDED: "has ended",
    EndReason.CANCELLED: "was cancelled",
    EndReason.EXPIRED: "expired",
    EndReason.EVICTED: "was evicted (max_sequences reached)",
    EndReason.FAILED: "failed",
    EndReason.SHUTDOWN: "was shut down",
}


@attrs.frozen(slots=True)
class TensorMetadata:
    """A declared input or output. ``datatype`` is an OIP datatype; ``shape`` uses -1
    for any size. ``any_datatype``: the model takes any datatype and shape here (OIP
    cannot say so: ``datatype`` is then only what metadata shows)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    any_datatype: bool = False


@attrs.frozen(slots=True)
class ModelMetadata:
    """OIP model metadata (``GET /v2/models/{name}``, gRPC ModelMetadata)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...] = ()
    outputs: tuple[TensorMetadata, ...] = ()
    #: what the model declares about its requests (:mod:`actorserve.declarations`); REST only
    parameters: Mapping[str, str | bool] = attrs.field(factory=dict)

    def input_datatypes(self) -> dict[str, str]:
        """Declared input name -> datatype ("" when the input takes any datatype)."""
        return {spec.name: "" if spec.any_datatype else spec.datatype for spec in self.inputs}


@attrs.frozen(slots=True)
class ModelInfo:
    """What a front door needs to know to route a request to a model version."""

    name: str
    version: str
    state: ModelState
    #: a BatchModel, stepped by continuous batchers
    batched: bool
    #: ``predict_stream`` consumes a stream of requests together (MLServer's stream-in)
    stream_input: bool
    workers: int
    max_batch_size: int = 0
    #: why the model is not READY (a load error, readable), else ""
    reason: str = ""
    #: how it generates text (:mod:`actorserve.textgen`); None: it does not
    text_generation: TextGeneration | None = None

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY


@attrs.frozen(slots=True)
class RepositoryEntry:
    """One row of the repository index."""

    name: str
    version: str
    state: ModelState
    reason: str = ""


@attrs.frozen(slots=True)
class ModelStatistics:
    """Counters of one model version, summed over its replicas."""

    name: str
    version: str
    #: requests accepted and not yet answered
    inflight: int
    #: requests waiting for a batch slot (BatchModel only)
    waiting: int = 0
    #: requests in the running batch; for a plain Model, inside predict / predict_stream
    running: int = 0
    steps: int = 0
    items_stepped: int = 0
    open_sequences: int = 0
    sequences_started: int = 0
    #: reason -> count of ended sequences
    sequences_ended: Mapping[str, int] = attrs.field(factory=dict)
    #: requests waiting in open sequences' mailboxes behind the running one
    queued: int = 0


@runtime_checkable
class ResponseIterator(Protocol):
    """The responses of one request. Besides ``async for``, :meth:`next_batch` returns
    every response already waiting (at least one, without waiting for more), so a
    transport can write them in one go; it raises :class:`StopAsyncIteration` at the
    end and the request's error, if it failed, after the responses before it."""

    def __aiter__(self) -> ResponseIterator: ...

    async def __anext__(self) -> InferenceResponse: ...

    async def next_batch(self) -> list[InferenceResponse]: ...

    async def next_raw_batch(self) -> Sequence[RawEvent | InferenceResponse]:
        """:meth:`next_batch`, with the responses a front's engine client received in
        the link's raw layout left raw (:mod:`actorserve.rawevents`), for a door that
        writes them without building a response per event. By default (every iterator
        but the engine client's, which subclass this protocol to inherit it) the
        responses themselves."""
        return await self.next_batch()


class OneByOne(ResponseIterator):
    """A :class:`ResponseIterator` over any async iterator (batches of one)."""

    __slots__ = ("_responses",)

    def __init__(self, responses: AsyncIterator[InferenceResponse]) -> None:
        self._responses = responses

    def __aiter__(self) -> OneByOne:
        return self

    async def __anext__(self) -> InferenceResponse:
        return await self._responses.__anext__()

    async def next_batch(self) -> list[InferenceResponse]:
        return [await self._responses.__anext__()]


ResponseStream = AbstractAsyncContextManager[ResponseIterator]


@runtime_checkable
class EngineAPI(Protocol):
    """What every front door calls. Errors are the domain errors of
    :mod:`actorserve.errors`; a transport maps them with one table.

    Streams are async context managers: leaving the block (or being cancelled) cancels
    the request in the engine, which drops it from its batch at the next step; the
    request's sequence, if any, stays open.

    Every method but the streams, :meth:`infer` and :meth:`call` is a unary call,
    labelled ``@unary`` with its record's name (``tests/test_unary.py`` checks that no
    method is neither)."""

    @unary("IsReady")
    async def ready(self) -> bool:
        """Every model loaded and ready, and the engine accepting work."""
        ...

    @unary("ListModels")
    async def models(self) -> list[ModelInfo]:
        """Every loaded model version."""
        ...

    @unary("GetModelInfo", remembered=True)
    async def model_info(self, name: str, version: str | None = None) -> ModelInfo:
        """One model version (default: the default or newest); :class:`ModelNotFound`."""
        ...

    @unary("GetMetadata", remembered=True)
    async def metadata(self, name: str, version: str | None = None) -> ModelMetadata: ...

    @unary("GetRepositoryIndex")
    async def repository_index(self) -> list[RepositoryEntry]: ...

    @unary("GetStatistics")
    async def statistics(self, name: str, version: str | None = None) -> ModelStatistics: ...

    @unary("LoadFromRepository")
    async def load_from_repository(self, name: str, config: Mapping[str, Any] | None = None) -> None:
        """(Re)load every version of model ``name`` from the model repository, importing
        its code afresh; ``config``: model-settings.json fields in place of the folder's
        (a load request's ``parameters.config``). :class:`ModelNotFound` or
        :class:`BadInput` say why not; the repository index keeps the reason."""
        ...

    @unary("LoadArchive")
    async def load_archive(
        self,
        path: str,
        *,
        name: str | None = None,
        handler: str | None = None,
        batch_size: int | None = None,
        max_batch_delay_ms: int | None = None,
        workers: int | None = None,
    ) -> ModelInfo:
        """Load a TorchServe model (a ``.mar`` file or a model folder) from ``path`` on
        the engine's disk (relative: in the first model folder), the keyword values
        overriding its ``model-config.yaml``; :class:`BadInput` says why not,
        :class:`ModelFailed` if its handler fails to initialize."""
        ...

    @unary("Unload")
    async def unload(self, name: str, version: str | None = None, *, grace: float | None = None) -> None:
        """Unload a model (every version, or one); in-flight requests get ``grace``
        seconds (default: the server's grace period); its sequences end ``shutdown``."""
        ...

    # -- management beyond the OIP (docs/management.md) --

    @unary("SetWorkers")
    async def set_workers(
        self, name: str, workers: int, version: str | None = None, *, grace: float | None = None
    ) -> None:
        """Scale a model version to ``workers`` replicas; removed replicas' in-flight
        requests get ``grace`` seconds and their sequences end ``shutdown``."""
        ...

    @unary("SetDefaultVersion")
    async def set_default_version(self, name: str, version: str) -> None:
        """Serve ``version`` of ``name`` when a request names no version."""
        ...

    @unary("Describe")
    async def describe(self, name: str, version: str | None = None) -> ModelDescription:
        """Workers, batch settings, open sequences, queue depths and state of a version."""
        ...

    @unary("GetInferenceStatistics")
    async def inference_statistics(
        self, name: str = "", version: str | None = None
    ) -> list[InferenceStatistics]:
        """Triton's statistics of one version, every version of ``name``, or (``name``
        empty) every loaded version."""
        ...

    async def infer(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> InferenceResponse:
        """One response (a streaming model's responses merged)."""
        ...

    def infer_stream(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> ResponseStream:
        """The responses of one request, as produced."""
        ...

    def stream(
        self, requests: AsyncIterator[InferenceRequest], *, model: str, version: str | None = None
    ) -> ResponseStream:
        """MLServer's ``predict_stream``: a stream of requests in, responses out."""
        ...

    @unary("WaitIdle")
    async def wait_idle(self) -> None:
        """Return once no request is in flight in any model (for tests and drains)."""
        ...

    async def call(self, request: UnaryCall[T]) -> T:
        """Run one unary method given as its record (:mod:`actorserve.unary`), e.g.
        ``await engine.call(Unload("m", grace=0))``: each ``@unary`` method above is one
        of these (its record is in :mod:`actorserve.unary_records`)."""
        ...


__all__ = [
    "ANY_ID_LENGTH",
    "MAX_SEQUENCE_ID_LENGTH",
    "OWNER_PARAMETER",
    "SEQUENCE_PARAMETERS",
    "BatchStatistics",
    "Duration",
    "InferenceStatistics",
    "ModelDescription",
    "ReplicaDescription",
    "EndReason",
    "EngineAPI",
    "ModelInfo",
    "ModelMetadata",
    "ModelState",
    "ModelStatistics",
    "OneByOne",
    "RepositoryEntry",
    "ResponseIterator",
    "ResponseStream",
    "RequestControl",
    "TensorMetadata",
    "UNARY_LABEL",
    "Unary",
    "UnaryCall",
    "bool_parameter",
    "control_of",
    "no_sequence_id",
    "no_sequence_text",
    "unary",
    "unary_of",
    "with_control",
]
