"""The engine's unary methods as typed records, and the one table that runs them.

Each unary (management) method of :class:`~actorserve.api.EngineAPI` is a frozen record
here, a :class:`~actorserve.api.UnaryCall` that names its result type (:class:`Unload`
is a ``UnaryCall[None]``), and one row of :data:`UNARY_CALLS`: its name on the engine
link and the engine coroutine it runs. Everything else follows from the table:

- ``Engine.call`` runs a record in process (:func:`dispatch`);
- the engine link (:mod:`actorserve.ipc.unary_values`) sends a record as its name and
  fields, and its result by the codec of the record's result type; the engine side
  decodes it and calls ``engine.call``; ``EngineClient``'s named methods are each one
  ``call``.

Adding a management method is a record here, a row in :data:`UNARY_CALLS` and the
method on :class:`~actorserve.engine.Engine` (docs/architecture.md, "Which files a
newcomer edits"). The fields of a record are the method's parameters, by the same names: the
link checks each value it receives against the field's annotation
(:func:`~actorserve.ipc.unary_values.call_from_plain`), so a field is ``str``, ``int``,
``float``, ``bool`` or ``Mapping[str, Any]``, optionally ``| None``.
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Generic, TypeVar

import attrs

from .api import (
    EngineAPI,
    InferenceStatistics,
    ModelDescription,
    ModelInfo,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    UnaryCall,
)

T = TypeVar("T")
R = TypeVar("R", bound=UnaryCall[Any])


# -- the records (one per unary method; the docstring names the EngineAPI method) -----------


@attrs.frozen
class IsReady(UnaryCall[bool]):
    """:meth:`~actorserve.api.EngineAPI.ready`"""


@attrs.frozen
class ListModels(UnaryCall[list[ModelInfo]]):
    """:meth:`~actorserve.api.EngineAPI.models`"""


@attrs.frozen
class GetModelInfo(UnaryCall[ModelInfo]):
    """:meth:`~actorserve.api.EngineAPI.model_info`"""

    name: str
    version: str | None = None


@attrs.frozen
class GetMetadata(UnaryCall[ModelMetadata]):
    """:meth:`~actorserve.api.EngineAPI.metadata`"""

    name: str
    version: str | None = None


@attrs.frozen
class GetRepositoryIndex(UnaryCall[list[RepositoryEntry]]):
    """:meth:`~actorserve.api.EngineAPI.repository_index`"""


@attrs.frozen
class GetStatistics(UnaryCall[ModelStatistics]):
    """:meth:`~actorserve.api.EngineAPI.statistics`"""

    name: str
    version: str | None = None


@attrs.frozen
class LoadFromRepository(UnaryCall[None]):
    """:meth:`~actorserve.api.EngineAPI.load_from_repository`"""

    name: str
    config: Mapping[str, Any] | None = None


@attrs.frozen
class LoadArchive(UnaryCall[ModelInfo]):
    """:meth:`~actorserve.api.EngineAPI.load_archive`"""

    path: str
    name: str | None = None
    handler: str | None = None
    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    workers: int | None = None


@attrs.frozen
class Unload(UnaryCall[None]):
    """:meth:`~actorserve.api.EngineAPI.unload`"""

    name: str
    version: str | None = None
    grace: float | None = None


@attrs.frozen
class SetWorkers(UnaryCall[None]):
    """:meth:`~actorserve.api.EngineAPI.set_workers`"""

    name: str
    workers: int
    version: str | None = None
    grace: float | None = None


@attrs.frozen
class SetDefaultVersion(UnaryCall[None]):
    """:meth:`~actorserve.api.EngineAPI.set_default_version`"""

    name: str
    version: str


@attrs.frozen
class Describe(UnaryCall[ModelDescription]):
    """:meth:`~actorserve.api.EngineAPI.describe`"""

    name: str
    version: str | None = None


@attrs.frozen
class GetInferenceStatistics(UnaryCall[list[InferenceStatistics]]):
    """:meth:`~actorserve.api.EngineAPI.inference_statistics`"""

    name: str = ""
    version: str | None = None


@attrs.frozen
class WaitIdle(UnaryCall[None]):
    """:meth:`~actorserve.api.EngineAPI.wait_idle`"""


# -- the table ----------------------------------------------------------------------------


@attrs.frozen
class Route(Generic[R]):
    """A row of :data:`UNARY_CALLS`: how one record is named on the link and run."""

    #: its name on the engine link (the EngineAPI method's name)
    name: str
    record: type[R]
    #: the engine coroutine it runs
    run: Callable[[EngineAPI, R], Awaitable[Any]]
    #: a front may keep the answer until the engine pushes ``ModelsChanged`` (the
    #: answers asked before every gRPC stream message, OpenAI completion and REST
    #: ``text_input`` generate; the engine's ``Watchers`` fire whenever one may change)
    remembered: bool = False

    @property
    def result(self) -> Any:
        """The type its answer has (the ``T`` of the record's ``UnaryCall[T]``)."""
        return result_type(self.record)


def route(
    name: str, record: type[R], run: Callable[[EngineAPI, R], Awaitable[Any]], *, remembered: bool = False
) -> Route[R]:
    """A row (a function, so mypy checks ``run`` against ``record``'s fields)."""
    return Route(name, record, run, remembered)


#: record type -> its row. The engine side serves exactly these unary calls; ``infer``
#: and the streams have messages of their own (:mod:`actorserve.ipc.frames`).
UNARY_CALLS: Final[dict[type[UnaryCall[Any]], Route[Any]]] = {
    row.record: row
    for row in (
        route("ready", IsReady, lambda engine, r: engine.ready()),
        route("models", ListModels, lambda engine, r: engine.models()),
        route(
            "model_info",
            GetModelInfo,
            lambda engine, r: engine.model_info(r.name, r.version),
            remembered=True,
        ),
        route(
            "metadata",
            GetMetadata,
            lambda engine, r: engine.metadata(r.name, r.version),
            remembered=True,
        ),
        route("repository_index", GetRepositoryIndex, lambda engine, r: engine.repository_index()),
        route("statistics", GetStatistics, lambda engine, r: engine.statistics(r.name, r.version)),
        route(
            "load_from_repository",
            LoadFromRepository,
            lambda engine, r: engine.load_from_repository(r.name, r.config),
        ),
        route(
            "load_archive",
            LoadArchive,
            lambda engine, r: engine.load_archive(
                r.path,
                name=r.name,
                handler=r.handler,
                batch_size=r.batch_size,
                max_batch_delay_ms=r.max_batch_delay_ms,
                workers=r.workers,
            ),
        ),
        route("unload", Unload, lambda engine, r: engine.unload(r.name, r.version, grace=r.grace)),
        route(
            "set_workers",
            SetWorkers,
            lambda engine, r: engine.set_workers(r.name, r.workers, r.version, grace=r.grace),
        ),
        route(
            "set_default_version",
            SetDefaultVersion,
            lambda engine, r: engine.set_default_version(r.name, r.version),
        ),
        route("describe", Describe, lambda engine, r: engine.describe(r.name, r.version)),
        route(
            "inference_statistics",
            GetInferenceStatistics,
            lambda engine, r: engine.inference_statistics(r.name, r.version),
        ),
        route("wait_idle", WaitIdle, lambda engine, r: engine.wait_idle()),
    )
}

#: link name -> row (what the engine side decodes a call by)
BY_NAME: Final[dict[str, Route[Any]]] = {row.name: row for row in UNARY_CALLS.values()}


def result_type(record: type[UnaryCall[Any]]) -> Any:
    """The ``T`` of ``record``'s ``UnaryCall[T]`` base, as written there (``list[ModelInfo]``;
    ``type(None)`` for ``None``)."""
    for base in getattr(record, "__orig_bases__", ()):
        if typing.get_origin(base) is UnaryCall:
            return typing.get_args(base)[0]
    raise TypeError(f"{record.__name__} does not name its result type (UnaryCall[...])")


async def dispatch(engine: EngineAPI, request: UnaryCall[T]) -> T:
    """Run ``request`` against ``engine``'s named method, by the table: what
    ``Engine.call`` does. ``TypeError`` (a bug, not the client's mistake: the link
    decodes only the table's records) for a record the table does not know."""
    row = UNARY_CALLS.get(type(request))
    if row is None:
        raise TypeError(f"{type(request).__name__} is not a unary engine call")
    result: T = await row.run(engine, request)
    return result


__all__ = [
    "BY_NAME",
    "UNARY_CALLS",
    "Describe",
    "GetInferenceStatistics",
    "GetMetadata",
    "GetModelInfo",
    "GetRepositoryIndex",
    "GetStatistics",
    "IsReady",
    "ListModels",
    "LoadArchive",
    "LoadFromRepository",
    "Route",
    "SetDefaultVersion",
    "SetWorkers",
    "Unload",
    "WaitIdle",
    "dispatch",
    "result_type",
    "route",
]
