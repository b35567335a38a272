"""TorchServe's management operations on an engine, answered with its JSON; shared by
the REST routes (:mod:`.management_rest`) and the gRPC ``ManagementAPIsService``.

Each operation returns a :class:`Reply` (HTTP status + TorchServe's JSON) or raises a
domain error or a :class:`~.errors.TsRefusal` in TorchServe's words (both mapped by
:func:`~.errors.ts_error`). Everything is synchronous: a scale or
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
from .errors import TsError, TsRefusal, model_not_found, version_not_found


@attrs.frozen
class Reply:
    code: int
    value: Any

    def json(self) -> bytes:
        return json.dumps(self.value, indent=2).encode()

    def msg(self) -> str:
        """``ManagementResponse.msg``: TorchServe's gRPC management sends a status
        (register, scale, set-default, unregister) as its bare message, a description
        or a list as its JSON."""
        if isinstance(self.value, dict) and list(self.value) == ["status"]:
            return str(self.value["status"])
        return self.json().decode()


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
        "loadedAtStartup": model.loaded_at_startup,
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
            raise model_not_found(name)
        return found

    async def _version(self, name: str, version: str | None) -> ModelInfo:
        """``version`` of ``name`` (None: its default version), refused in TorchServe's
        words when either is unknown."""
        await self._versions(name)
        try:
            return await self.engine.model_info(name, version)
        except ModelNotFound:
            raise version_not_found(name, str(version)) from None

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
        info = await self._version(name, version)
        return Reply(200, [_describe(await self.engine.describe(name, info.version))])

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
        info = await self._version(name, version)
        wanted = _int_option(options, "min_worker")
        if wanted is None:
            wanted = _int_option(options, "max_worker")
        if wanted is None:
            wanted = info.workers
        if wanted < 1:
            raise BadInput("min_worker must be >= 1 (actorserve keeps at least one worker per loaded model)")
        await self.engine.set_workers(name, wanted, info.version)
        named = f", version: {version}" if version else ""  # TorchServe names a version asked for
        return _status(f"Workers scaled to {wanted} for model: {name}{named}")

    async def set_default(self, name: str, version: str) -> Reply:
        await self._versions(name)
        try:
            await self.engine.model_info(name, version)
        except ModelNotFound:
            message = f"Model version {version} does not exist for model {name}"  # sic: no colons here
            raise TsRefusal(TsError(404, "ModelVersionNotFoundException", message)) from None
        await self.engine.set_default_version(name, version)
        return _status(f'Default version successfully updated for model "{name}" to "{version}"')

    async def unregister(self, name: str, version: str | None = None) -> Reply:
        """One version (None: the default one); as in TorchServe the default version
        goes last: move the default first (403 while other versions are loaded)."""
        versions = await self._versions(name)
        default = (await self.engine.model_info(name)).version
        version = version or default
        if version == default and len(versions) > 1:
            message = f"Cannot remove default version for model {name}"
            raise TsRefusal(TsError(403, "InvalidModelVersionException", message))
        await self._version(name, version)
        await self.engine.unload(name, version)
        return _status(f'Model "{name}" unregistered')
