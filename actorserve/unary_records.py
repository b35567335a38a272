"""The records of the unary engine calls, one per ``@unary`` method of
:class:`~actorserve.api.EngineAPI` (its parameters as fields, its result type as the
``T`` of ``UnaryCall[T]``), and :data:`ROWS`, of which :mod:`actorserve.unary` makes
its table.

Written by ``python -m actorserve.unarygen`` from ``api.py``: do not edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .api import (
    InferenceStatistics,
    ModelDescription,
    ModelInfo,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    UnaryCall,
)


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


#: each method's name on the engine link, its record, and whether a front may
#: remember its answer (``@unary(..., remembered=True)``), in ``api.py``'s order
ROWS: Final[tuple[tuple[str, type[UnaryCall[Any]], bool], ...]] = (
    ("ready", IsReady, False),
    ("models", ListModels, False),
    ("model_info", GetModelInfo, True),
    ("metadata", GetMetadata, True),
    ("repository_index", GetRepositoryIndex, False),
    ("statistics", GetStatistics, False),
    ("load_from_repository", LoadFromRepository, False),
    ("load_archive", LoadArchive, False),
    ("unload", Unload, False),
    ("set_workers", SetWorkers, False),
    ("set_default_version", SetDefaultVersion, False),
    ("describe", Describe, False),
    ("inference_statistics", GetInferenceStatistics, False),
    ("wait_idle", WaitIdle, False),
)

__all__ = [
    "ROWS",
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
    "SetDefaultVersion",
    "SetWorkers",
    "Unload",
    "WaitIdle",
]
