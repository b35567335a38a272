"""TorchServe's management operations on an engine, answered with its JSON; shared by
the REST routes (:mod:`.management_rest`) and the gRPC ``ManagementAPIsService``.

Each operation returns a :class:`Reply` (HTTP status + TorchServe's JSON) or raises a
domain error (mapped by :func:`~.calls.ts_error`). Everything is synchronous: a scale or
a registration is answered once it is done.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from ...api import EngineAPI, ModelDescription, ModelInfo, ReplicaDescription
from ...errors import BadInput, ModelNotFound
from ...modelsettings import check_name


@attrs.frozen
class Reply:
    code: int
    value: Any

    def json(self) -> bytes:
        return json.dumps(self.value, indent=2).encode()


def _status(message: str, code: int = 200) -> Reply:
    return Reply(code, {"status": message})


def _int_option(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise BadInput(f"parameter {key!r} must be an integer, got {value!r}") from None
    if number < 0:
        raise BadInput(f"parameter {key!r} must be >= 0, got {number}")
    return number


def _worker(state: str, replica: ReplicaDescription) -> dict[str, Any]:
    return {
        "id": str(replica.index + 1),
        "status": state,
        "gpu": False,
        "memoryUsage": 0,
        "waiting": replica.waiting,
        "running": replica.running,
    }


def _describe(model: ModelDescription) -> dict[str, Any]:
    """TorchServe's description of a model version."""
    value: dict[str, Any] = {
        "modelName": model.name,
        "modelVersion": model.version,
        "modelUrl": model.name,
        "runtime": "python",
        "minWorkers": model.workers,
        "maxWorkers": model.workers,
        "batchSize": model.max_batch_size or 1,
        "maxBatchDelay": round(model.max_batch_time * 1000),
        "maxRetryTimeoutInSec": 0,
        "loadedAtStartup": False,
        "status": model.state,
        "workers": [_worker(model.state, r) for r in model.replicas],
    }
    if model.max_sequences:
        value.update(
            sequenceMaxIdleMSec=model.idle_timeout_ms,
            sequenceTimeoutMSec=model.max_duration_ms,
            maxSequenceJobQueueSize=model.max_queue,
            maxNumSequence=model.max_sequences,
            openSequences=model.open_sequences,
        )
    return value


class Management:
    """TorchServe's management API on ``engine``."""

    def __init__(self, engine: EngineAPI) -> None:
        self.engine = engine

    async def _versions(self, name: str) -> list[ModelInfo]:
        found = [m for m in await self.engine.models() if m.name == name]
        if not found:
            raise ModelNotFound(f"Model not found: {name}")
        return found

    async def list_models(self, limit: int | None = None, next_page_token: int | None = None) -> Reply:
        names = sorted({m.name for m in await self.engine.models()})
        limit = limit or 100
        start = next_page_token or 0
        page = names[start : start + limit]
        value: dict[str, Any] = {"models": [{"modelName": n, "modelUrl": n} for n in page]}
        if start + limit < len(names):
            value["nextPageToken"] = str(start + limit)
        return Reply(200, value)

    async def describe(self, name: str, version: str | None = None) -> Reply:
        if version == "all":
            versions = await self._versions(name)
            return Reply(200, [_describe(await self.engine.describe(name, m.version)) for m in versions])
        await self._versions(name)
        try:
            description = await self.engine.describe(name, version)
        except ModelNotFound:
            raise ModelNotFound(f"Model version: {version} does not exist for model: {name}") from None
        return Reply(200, [_describe(description)])

    async def register(self, options: Mapping[str, str]) -> Reply:
        """``url`` (required), ``model_name``, ``handler``, ``batch_size``,
        ``max_batch_delay`` (ms), ``initial_workers``; loading is always synchronous."""
        url = options.get("url")
        if not url:
            raise BadInput("Parameter url is required.")
        name = options.get("model_name") or None
        if name is not None:  # before the archive is opened; its own name is checked on load
            check_name(name)
        info = await self.engine.load_archive(
            url,
            name=name,
            handler=options.get("handler") or None,
            batch_size=_int_option(options, "batch_size"),
            max_batch_delay_ms=_int_option(options, "max_batch_delay"),
            workers=_int_option(options, "initial_workers") or None,
        )
        return _status(
            f'Model "{info.name}" Version: {info.version} registered with {info.workers} initial workers'
        )

    async def scale(self, name: str, version: str | None, options: Mapping[str, str]) -> Reply:
        """``min_worker`` (else ``max_worker``) replicas; always synchronous."""
        versions = await self._versions(name)
        info = await self.engine.model_info(name, version) if version else versions[0]
        wanted = _int_option(options, "min_worker")
        if wanted is None:
            wanted = _int_option(options, "max_worker")
        if wanted is None:
            wanted = info.workers
        if wanted < 1:
            raise BadInput("min_worker must be >= 1 (actorserve keeps at least one worker per loaded model)")
        await self.engine.set_workers(name, wanted, info.version)
        return _status(f"Workers scaled to {wanted} for model: {name}")

    async def set_default(self, name: str, version: str) -> Reply:
        await self._versions(name)
        try:
            await self.engine.model_info(name, version)
        except ModelNotFound:
            raise ModelNotFound(f"Model version {version} does not exist for model {name}") from None
        await self.engine.set_default_version(name, version)
        return _status(f'Default version successfully updated for model "{name}" to "{version}"')

    async def unregister(self, name: str, version: str | None = None) -> Reply:
        await self._versions(name)
        if version is not None:
            try:
                await self.engine.model_info(name, version)
            except ModelNotFound:
                raise ModelNotFound(f"Model version: {version} does not exist for model: {name}") from None
        await self.engine.unload(name, version)
        return _status(f'Model "{name}" unregistered')
