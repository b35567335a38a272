"""Settings: per model (``model-settings.json``, MLServer's shape plus ``sequence`` and
``workers``) and server-wide (CLI flags, ``ACTORSERVE_*`` variables).

Nothing here is read at import time; callers load settings and pass them down.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .errors import BadInput

MODEL_SETTINGS_FILE = "model-settings.json"


class SettingsError(BadInput, ValueError):
    """A settings file or value is invalid; the message names the file and the problem.

    A :class:`BadInput`, so a load request naming a broken model folder is answered
    400 / INVALID_ARGUMENT by both transports."""


@attrs.frozen
class SequenceSettings:
    """Limits of stateful sequences (the ``sequence`` block of model-settings.json).

    Times are milliseconds; 0 turns a timeout off.
    """

    idle_timeout_ms: int = 60_000
    max_duration_ms: int = 0
    max_queue: int = 16
    max_sequences: int = 1024
    evict_idle: bool = False


@attrs.frozen
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]


@attrs.frozen
class ModelSettings:
    """One model version's settings.

    ``implementation`` is ``"package.module.Class"``, or a class object when settings are
    built in code. ``max_batch_time`` is in seconds, as in MLServer.
    """

    name: str
    implementation: Any
    version: str = "1"
    parameters: Mapping[str, Any] = attrs.field(factory=dict)
    max_batch_size: int = 0
    max_batch_time: float = 0.0
    workers: int = 1
    sequence: SequenceSettings = SequenceSettings()
    #: items buffered per streaming reply before the batcher pauses that item.
    reply_buffer: int = 64
    #: requests without a sequence waiting for a batch slot (per replica) or running on a
    #: plain Model; beyond it requests are refused with Overloaded.
    max_pending: int = 1024
    platform: str = ""
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    versions: tuple[str, ...] = ()
    folder: Path | None = None

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise SettingsError("model settings need a 'name'")
        if self.workers < 1:
            raise SettingsError(f"model {self.name!r}: workers must be >= 1")
        if self.max_batch_size < 0 or self.max_batch_time < 0:
            raise SettingsError(f"model {self.name!r}: batch limits must be >= 0")
        if self.reply_buffer < 1 or self.max_pending < 1:
            raise SettingsError(f"model {self.name!r}: reply_buffer and max_pending must be >= 1")


def _specs(value: Any, where: str) -> tuple[TensorSpec, ...]:
    if value is None:
        return ()
    try:
        return tuple(
            TensorSpec(str(v["name"]), str(v.get("datatype", "")), tuple(v.get("shape", ())))
            for v in value
        )
    except (TypeError, KeyError, AttributeError) as exc:
        raise SettingsError(f"{where}: bad tensor metadata: {exc}") from None


def model_settings_from_dict(
    data: Mapping[str, Any], *, folder: Path | None = None, where: str = "settings"
) -> ModelSettings:
    """Build :class:`ModelSettings` from MLServer-shaped JSON data."""
    if not isinstance(data, Mapping):
        raise SettingsError(f"{where}: expected a JSON object")
    known = {
        "name", "implementation", "parameters", "max_batch_size", "max_batch_time", "workers",
        "sequence", "reply_buffer", "max_pending", "platform", "inputs", "outputs", "versions",
    }  # fmt: skip
    unknown = set(data) - known
    if unknown:
        raise SettingsError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
    name = data.get("name") or (folder.name if folder else None)
    if not name:
        raise SettingsError(f"{where}: missing 'name'")
    implementation = data.get("implementation")
    if not implementation:
        raise SettingsError(f"{where}: missing 'implementation'")
    parameters = dict(data.get("parameters") or {})
    try:
        sequence = SequenceSettings(**(data.get("sequence") or {}))
    except TypeError as exc:
        raise SettingsError(f"{where}: bad 'sequence' block: {exc}") from None
    try:
        return ModelSettings(
            name=str(name),
            implementation=implementation,
            version=str(parameters.get("version") or "1"),
            parameters=parameters,
            max_batch_size=int(data.get("max_batch_size", 0)),
            max_batch_time=float(data.get("max_batch_time", 0.0)),
            workers=int(data.get("workers", 1)),
            sequence=sequence,
            reply_buffer=int(data.get("reply_buffer", 64)),
            max_pending=int(data.get("max_pending", 1024)),
            platform=str(data.get("platform", "")),
            inputs=_specs(data.get("inputs"), where),
            outputs=_specs(data.get("outputs"), where),
            versions=tuple(data.get("versions") or ()),
            folder=folder,
        )
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{where}: {exc}") from None


def load_model_settings(path: Path | str) -> ModelSettings:
    """Read one ``model-settings.json`` (or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_SETTINGS_FILE
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{path}: invalid JSON: {exc}") from None
    return model_settings_from_dict(data, folder=path.parent, where=str(path))


def discover_models(folder: Path | str) -> list[ModelSettings]:
    """Every model under ``folder``: the folder itself or its subfolders (any depth)
    that hold a ``model-settings.json``, sorted by path."""
    root = Path(folder)
    if not root.is_dir():
        raise SettingsError(f"{root}: not a folder")
    files = sorted(root.rglob(MODEL_SETTINGS_FILE))
    if not files:
        raise SettingsError(f"{root}: no {MODEL_SETTINGS_FILE} found")
    return [load_model_settings(f) for f in files]


def _env_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@attrs.frozen
class Settings:
    """Server-wide settings. ``http_port``/``grpc_port`` 0 picks a free port; ``None``
    turns that transport off."""

    models: tuple[ModelSettings, ...] = ()
    host: str = "127.0.0.1"
    http_port: int | None = 8080
    grpc_port: int | None = 8081
    #: largest request body accepted over REST, in bytes.
    max_body_bytes: int = 64 * 1024 * 1024
    #: seconds in-flight requests get to finish on shutdown before they are cancelled.
    grace_period: float = 10.0
    #: gzip non-streaming REST responses larger than this when the client accepts gzip.
    gzip_min_bytes: int = 1024
    #: ModelStreamInfer flavour: "triton" (ModelStreamInferResponse envelope) or "mlserver".
    grpc_stream_dialect: str = "triton"
    #: requests in flight on one ModelStreamInfer call before the server stops reading it.
    grpc_stream_max_inflight: int = 64
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``ACTORSERVE_*`` variables; keyword overrides win."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field in attrs.fields(cls):
            key = "ACTORSERVE_" + field.name.upper()
            if field.name == "models" or key not in env:
                continue
            raw = env[key]
            if field.name in ("http_port", "grpc_port"):
                values[field.name] = None if raw.lower() in ("", "off", "none") else int(raw)
            elif field.type in ("int", int):
                values[field.name] = int(raw)
            elif field.type in ("float", float):
                values[field.name] = float(raw)
            elif field.type in ("bool", bool):
                values[field.name] = _env_bool(raw)
            else:
                values[field.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_models(self, models: Iterable[ModelSettings]) -> Settings:
        return attrs.evolve(self, models=tuple(models))
