"""TorchServe model archives: ``.mar`` files and model folders, read into our settings.

A ``.mar`` is a zip holding ``MAR-INF/MANIFEST.json`` (``model.modelName``,
``modelVersion``, ``handler``, ``serializedFile``, ``modelFile``, ``configFile``) and
the files it names; it is extracted into a temporary folder (removed at exit), once per
archive file (loading the same unchanged ``.mar`` again reuses that folder), within
:class:`ArchiveLimits` counted while extracting, never trusting the zip's headers. A
folder with ``MAR-INF/MANIFEST.json`` (``torch-model-archiver --archive-format
no-archive``) is used in place. ``model-config.yaml`` keys map onto
:class:`~actorserve.settings.ModelSettings` (see :data:`CONFIG_KEYS`); the whole file
reaches the handler as ``context.model_yaml_config``.
"""

from __future__ import annotations

import atexit
import json
import shutil
import threading
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..settings import ModelSettings, SequenceSettings, SettingsError
from ..tempdirs import make_temp_folder
from ..torchserve_envelope import PLATFORM, SEQUENCE_PLATFORM

MANIFEST: Final = "MAR-INF/MANIFEST.json"
IMPLEMENTATION: Final = "actorserve.torchserve.handler_model.TorchServeModel"
#: the largest MANIFEST.json or model-config.yaml read
MAX_MANIFEST_BYTES: Final = 1024 * 1024

#: model-config.yaml keys we act on (the rest are kept for the handler and ignored)
CONFIG_KEYS: Final = (
    "batchSize",
    "maxBatchDelay",
    "minWorkers",
    "maxWorkers",
    "responseTimeout",
    "sequenceBatching",
    "continuousBatching",
    "sequenceMaxIdleMSec",
    "sequenceTimeoutMSec",
    "maxSequenceJobQueueSize",
    "maxNumSequence",
    "handler",
)


def is_archive(path: Path) -> bool:
    """A ``.mar`` file or a folder holding ``MAR-INF/MANIFEST.json``."""
    return (path.is_file() and path.suffix == ".mar") or (path / MANIFEST).is_file()


def find_archives(folder: Path) -> list[Path]:
    """Every archive directly in ``folder`` (TorchServe's model store), or ``folder``
    itself when it is one."""
    if is_archive(folder):
        return [folder]
    if not folder.is_dir():
        return []
    return [p for p in sorted(folder.iterdir()) if is_archive(p)]


def archive_name(path: Path) -> str:
    """The model name of an archive (its manifest's ``modelName``, else the file or folder
    name), read without extracting it; a broken archive is named by its path."""
    try:
        if path.is_file():
            with zipfile.ZipFile(path) as archive:
                if archive.getinfo(MANIFEST).file_size > MAX_MANIFEST_BYTES:
                    return path.stem
                manifest = json.loads(archive.read(MANIFEST))
        else:
            if (path / MANIFEST).stat().st_size > MAX_MANIFEST_BYTES:
                return path.stem
            manifest = json.loads((path / MANIFEST).read_text())
        name = manifest["model"]["modelName"]
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return path.stem
    return str(name) if name else path.stem


@attrs.frozen
class ArchiveLimits:
    """How much one ``.mar`` may hold once extracted (settings ``max_archive_bytes`` and
    ``max_archive_members``): a small zip of zeros can inflate to gigabytes."""

    max_bytes: int = 16 * 1024**3
    max_members: int = 100_000


#: (archive path, size, mtime) -> its extraction, so a reload of an unchanged archive
#: reuses the folder instead of extracting another copy. Guarded by the lock: loads
#: extract in worker threads.
_extracted: dict[tuple[str, int, int], Path] = {}
_extracting = threading.Lock()
_CHUNK: Final = 1024 * 1024


def _extract(path: Path, limits: ArchiveLimits) -> Path:
    """The folder holding ``path`` extracted (blocking: call it off the event loop)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _extracting:
        known = _extracted.get(key)
        if known is not None and known.is_dir():
            return known
        target = make_temp_folder(f"mar-{path.stem}")
        atexit.register(shutil.rmtree, target, True)
        try:
            with zipfile.ZipFile(path) as archive:
                _extract_members(path, archive, target, limits)
        except (zipfile.BadZipFile, OSError) as exc:
            shutil.rmtree(target, True)
            raise SettingsError(f"{path}: not a readable .mar archive: {exc}") from None
        except SettingsError:
            shutil.rmtree(target, True)
            raise
        _extracted[key] = target
        return target


def _extract_members(path: Path, archive: zipfile.ZipFile, target: Path, limits: ArchiveLimits) -> None:
    members = archive.infolist()
    if len(members) > limits.max_members:
        raise SettingsError(
            f"{path}: the archive has {len(members)} members, more than max_archive_members ({limits.max_members})"
        )
    root = target.resolve()
    too_large = SettingsError(
        f"{path}: the archive extracts to more than max_archive_bytes ({limits.max_bytes} bytes)"
    )
    if sum(m.file_size for m in members) > limits.max_bytes:  # what the headers declare
        raise too_large
    written = 0
    for member in members:
        destination = (target / member.filename).resolve()
        if not destination.is_relative_to(root):  # no member may land outside the folder
            raise SettingsError(f"{path}: archive member {member.filename!r} points outside the archive")
        if member.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(member) as source, destination.open("wb") as out:
            while chunk := source.read(_CHUNK):  # counted as written: headers can lie
                written += len(chunk)
                if written > limits.max_bytes:
                    raise too_large
                out.write(chunk)


def _check_small(path: Path) -> None:
    """A manifest or model-config.yaml is a few hundred bytes: one of megabytes is refused
    before it is read and parsed (on every load, and for every archive of the store)."""
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise SettingsError(
            f"{path}: larger than {MAX_MANIFEST_BYTES} bytes, the most a manifest or config may be"
        )


def read_manifest(model_dir: Path) -> dict[str, Any]:
    path = model_dir / MANIFEST
    if not path.is_file():
        return {}
    _check_small(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SettingsError(f"{path}: cannot read the manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise SettingsError(f"{path}: the manifest is not a JSON object")
    return manifest


def read_model_config(model_dir: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``model-config.yaml`` (the manifest's ``configFile``, else that name if present)."""
    model = manifest.get("model") or {}
    name = model.get("configFile") if isinstance(model, Mapping) else None
    path = inside(model_dir, str(name or "model-config.yaml"), "configFile")
    if not path.is_file():
        if name:
            raise SettingsError(f"{model_dir}: the manifest names config file {name!r}, which is missing")
        return {}
    import yaml

    _check_small(path)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"{path}: cannot read: {exc}") from None
    if not isinstance(config, dict):
        raise SettingsError(f"{path}: expected a mapping of settings")
    return config


def inside(model_dir: Path, name: str, field: str, value: str | None = None) -> Path:
    """``model_dir / name``, refused (:class:`SettingsError` naming ``field``) unless it
    stays inside the model's folder once resolved: a manifest is the archive's own word,
    and ``../../../proc/self/environ`` must not make the server read (and answer with
    pieces of) a file of its own. ``value``: the field's whole value, when ``name`` is
    a part of it."""
    shown = name if value is None else value
    if "\x00" in name:
        raise SettingsError(f"{model_dir}: the manifest's {field} {shown!r} is not a file name")
    path = model_dir / name
    if not path.resolve().is_relative_to(model_dir.resolve()):
        raise SettingsError(f"{model_dir}: the manifest's {field} {shown!r} points outside the archive")
    return path


def check_handler(model_dir: Path, handler: str) -> None:
    """A handler (``module[.py][:function]``) names a module of the archive or one of
    TorchServe's default handlers by name: as a path it must stay inside the archive."""
    module = handler.partition(":")[0]
    if "/" in module or "\\" in module or module.startswith("."):
        inside(model_dir, module, "handler", handler)


def _int(config: Mapping[str, Any], key: str, default: int, where: Path) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettingsError(f"{where}: {key} must be an integer >= 0, got {value!r}")
    return value


def _bool(config: Mapping[str, Any], key: str, where: Path) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise SettingsError(f"{where}: {key} must be true or false, got {value!r}")
    return value


@attrs.frozen
class Overrides:
    """What a registration may set over the archive (TorchServe's RegisterModel /
    ``POST /models`` parameters); None keeps the archive's value."""

    name: str | None = None
    handler: str | None = None
    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    workers: int | None = None
    response_timeout_s: int | None = None


def archive_settings(
    path: Path | str, overrides: Overrides = Overrides(), limits: ArchiveLimits = ArchiveLimits()
) -> ModelSettings:
    """The settings of the TorchServe model at ``path`` (a ``.mar`` or a folder);
    :class:`SettingsError` says what is wrong with it. Blocking (a ``.mar`` is extracted):
    an event loop calls it in a worker thread."""
    path = Path(path)
    if not path.exists():
        raise SettingsError(f"{path}: no such model archive or folder")
    model_dir = _extract(path, limits) if path.is_file() else path
    manifest = read_manifest(model_dir)
    model = manifest.get("model") or {}
    if not isinstance(model, Mapping):
        raise SettingsError(f"{path}: the manifest's 'model' is not an object")
    config = read_model_config(model_dir, manifest)
    where = model_dir / "model-config.yaml"
    name = overrides.name or model.get("modelName") or path.stem
    handler = overrides.handler or model.get("handler")
    if not handler:
        raise SettingsError(f"{path}: no handler: the manifest names none and none was given")
    check_handler(model_dir, str(handler))
    batch_size = overrides.batch_size or _int(config, "batchSize", 1, where)
    delay_ms = overrides.max_batch_delay_ms
    if delay_ms is None:
        delay_ms = _int(config, "maxBatchDelay", 100, where)
    min_workers = _int(config, "minWorkers", 1, where)
    workers = overrides.workers or min_workers or _int(config, "maxWorkers", 1, where) or 1
    timeout = overrides.response_timeout_s or _int(config, "responseTimeout", 120, where)
    sequence_batching = _bool(config, "sequenceBatching", where)
    continuous = _bool(config, "continuousBatching", where)
    sequence = SequenceSettings(
        idle_timeout_ms=_int(config, "sequenceMaxIdleMSec", 0, where) if sequence_batching else 60_000,
        max_duration_ms=_int(config, "sequenceTimeoutMSec", 0, where),
        max_queue=max(1, _int(config, "maxSequenceJobQueueSize", 1, where)),
        max_sequences=max(1, _int(config, "maxNumSequence", 1024, where)),
    )
    parameters = {
        "model_dir": str(model_dir),
        "source": str(path),
        "handler": str(handler),
        "manifest": manifest,
        "model_yaml_config": config,
        "sequence_batching": sequence_batching,
        "continuous_batching": continuous,
        "response_timeout_s": timeout,
        "min_workers": min_workers,
        "max_workers": _int(config, "maxWorkers", workers, where),
    }
    return ModelSettings(
        name=str(name),
        implementation=IMPLEMENTATION,
        version=str(model.get("modelVersion") or "1.0"),
        parameters=parameters,
        max_batch_size=max(1, batch_size),
        max_batch_time=delay_ms / 1000 if batch_size > 1 else 0.0,
        workers=max(1, workers),
        sequence=sequence,
        platform=SEQUENCE_PLATFORM if sequence_batching else PLATFORM,
        folder=model_dir,
    )
