"""The engine client's unary methods: each ``@unary`` method of
:class:`~actorserve.api.EngineAPI`, with its signature, as one :meth:`~UnaryMethods.call`
of its record (:mod:`actorserve.unary_records`); ``EngineClient`` inherits them and
sends the call. A ``remembered`` one first looks its answer up by the key
``EngineClient.call`` keeps it under, before a record is built (``model_info`` and
``metadata`` are asked before every gRPC stream message, OpenAI completion and REST
``text_input`` generate; a frozen record costs ~1.4 us more to build and hash).

Written by ``python -m actorserve.unarygen`` from ``api.py``: do not edit.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, TypeVar

from ..api import (
    InferenceStatistics,
    ModelDescription,
    ModelInfo,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    UnaryCall,
)
from ..unary_records import (
    Describe,
    GetInferenceStatistics,
    GetMetadata,
    GetModelInfo,
    GetRepositoryIndex,
    GetStatistics,
    IsReady,
    ListModels,
    LoadArchive,
    LoadFromRepository,
    SetDefaultVersion,
    SetWorkers,
    Unload,
    WaitIdle,
)

T = TypeVar("T")


class UnaryMethods(abc.ABC):
    """EngineAPI's unary methods over :meth:`call` (see the module)."""

    #: the answers of ``remembered`` calls by (record type, its fields...)
    _remembered: dict[tuple[Any, ...], Any]

    @abc.abstractmethod
    async def call(self, request: UnaryCall[T]) -> T:
        """Run a unary call given as its record."""

    async def ready(self) -> bool:
        return await self.call(IsReady())

    async def models(self) -> list[ModelInfo]:
        return await self.call(ListModels())

    async def model_info(self, name: str, version: str | None = None) -> ModelInfo:
        remembered: ModelInfo | None = self._remembered.get((GetModelInfo, name, version))
        return remembered if remembered is not None else await self.call(GetModelInfo(name, version))

    async def metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        remembered: ModelMetadata | None = self._remembered.get((GetMetadata, name, version))
        return remembered if remembered is not None else await self.call(GetMetadata(name, version))

    async def repository_index(self) -> list[RepositoryEntry]:
        return await self.call(GetRepositoryIndex())

    async def statistics(self, name: str, version: str | None = None) -> ModelStatistics:
        return await self.call(GetStatistics(name, version))

    async def load_from_repository(self, name: str, config: Mapping[str, Any] | None = None) -> None:
        await self.call(LoadFromRepository(name, config))

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
        return await self.call(LoadArchive(path, name, handler, batch_size, max_batch_delay_ms, workers))

    async def unload(self, name: str, version: str | None = None, *, grace: float | None = None) -> None:
        await self.call(Unload(name, version, grace))

    async def set_workers(
        self, name: str, workers: int, version: str | None = None, *, grace: float | None = None
    ) -> None:
        await self.call(SetWorkers(name, workers, version, grace))

    async def set_default_version(self, name: str, version: str) -> None:
        await self.call(SetDefaultVersion(name, version))

    async def describe(self, name: str, version: str | None = None) -> ModelDescription:
        return await self.call(Describe(name, version))

    async def inference_statistics(
        self, name: str = "", version: str | None = None
    ) -> list[InferenceStatistics]:
        return await self.call(GetInferenceStatistics(name, version))

    async def wait_idle(self) -> None:
        await self.call(WaitIdle())
