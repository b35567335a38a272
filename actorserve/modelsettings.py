"""Per-model settings: ``model-settings.json`` (MLServer's shape plus ``sequence`` and
``workers``), read, checked and discovered in model folders. The server-wide settings
are in :mod:`actorserve.settings`, which re-exports everything here.

Nothing here is read at import time; callers load settings and pass them down.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from .controls import MAX_SEQUENCE_ID_LENGTH
from .errors import BadInput
from .jsonvalues import json_number, json_object, kind, whole_number
from .textgen import TextGeneration
from .types import DATATYPES
from .warmup import MAX_WARMUP, Warmup, warmup_from_json

MODEL_SETTINGS_FILE = "model-settings.json"

#: The ``datatype`` of a tensor that takes any datatype and any shape (a pass-through,
#: like ``identity``). OIP has no such datatype, so metadata shows it as
#: :data:`ANY_DATATYPE_SHOWN_AS` (the datatype of the docs' examples).
ANY_DATATYPE = "ANY"
ANY_DATATYPE_SHOWN_AS = "FP32"

#: The default ``step_timeout`` (seconds): one step is one iteration of a batch, so a
#: minute is far past any healthy step yet short enough that a hung replica is noticed
#: and replaced while its clients still wait.
DEFAULT_STEP_TIMEOUT = 60.0


class SettingsError(BadInput, ValueError):
    """A settings file or value is invalid; the message names the file and the problem.

    A :class:`BadInput`, so a load request naming a broken model folder is answered
    400 / INVALID_ARGUMENT by both transports."""


#: what a model name (and a version) may be: it is a path segment of every REST door, a
#: metric label and an access-log field, so no ``/``, no ``..``, no space or newline
NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: the longest model name or version
MAX_NAME_LENGTH: Final = 128
NAME_RULE: Final = f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {MAX_NAME_LENGTH} characters"


def check_name(value: object, what: str = "model name") -> str:
    """``value`` if it is a valid model name (or version, ``what``); else
    :class:`SettingsError` (a :class:`BadInput`: 400) naming the rule. Every name that
    enters the server (settings, model folders, archives, TorchServe's register) passes
    here."""
    if not isinstance(value, str) or len(value) > MAX_NAME_LENGTH or not NAME_PATTERN.fullmatch(value):
        shown = repr(value) if not isinstance(value, str) or len(value) <= 80 else repr(value[:80]) + "..."
        raise SettingsError(f"{what} {shown} is not valid: use {NAME_RULE}")
    return value


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
    #: longest client-chosen ``sequence_id`` (characters); a longer one is refused 400
    max_id_length: int = MAX_SEQUENCE_ID_LENGTH
    #: open sequences one token may hold when sequences are bound to tokens
    #: (``--bind-sequences-to-token``); 0: only ``max_sequences`` bounds them
    max_sequences_per_token: int = 0


@attrs.frozen
class TensorSpec:
    """A declared input or output (``inputs`` / ``outputs`` of model-settings.json).

    ``datatype`` is an OIP datatype or :data:`ANY_DATATYPE`; ``shape`` uses -1 for a
    dimension of any size (the rank is fixed). An ``optional`` input may be left out of
    a request. :class:`SettingsError` for a datatype that is neither."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def __attrs_post_init__(self) -> None:
        if self.datatype not in DATATYPES and self.datatype != ANY_DATATYPE:
            raise SettingsError(
                f"tensor {self.name!r}: datatype {self.datatype!r} is not an OIP datatype "
                f"({', '.join(DATATYPES)}) nor {ANY_DATATYPE!r} (any datatype and shape)"
            )
        if any(d < -1 for d in self.shape):
            raise SettingsError(
                f"tensor {self.name!r}: shape {list(self.shape)}: a dimension is >= 0, or -1 for any size"
            )

    @property
    def any_datatype(self) -> bool:
        """Takes a tensor of any datatype and any shape."""
        return self.datatype == ANY_DATATYPE

    @property
    def metadata_datatype(self) -> str:
        """The datatype model metadata shows (always an OIP datatype)."""
        return ANY_DATATYPE_SHOWN_AS if self.datatype == ANY_DATATYPE else self.datatype


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
    #: request parameters the model knows (``request.parameters`` of model-settings.json),
    #: added to the model class's ``request_parameters``; None: not declared here.
    request_parameters: frozenset[str] | None = None
    #: the ``text_generation`` block (see :mod:`actorserve.textgen`), laid over the model
    #: class's declaration; None: the class's declaration as it is.
    text_generation: Mapping[str, Any] | None = None
    #: seconds one step of a BatchModel replica (or a plain Model's wait for its next
    #: response) may take before the replica is declared hung (its requests fail, it is
    #: replaced); 0 turns the deadline off. See docs/writing-a-model.md, "Faults".
    step_timeout: float = DEFAULT_STEP_TIMEOUT
    #: a BatchModel replica that has admitted this many requests is replaced by a fresh
    #: one (its own work and sequences finish on it first, then it is unloaded): frees
    #: what a leaking model holds, like gunicorn's max_requests. 0: never.
    max_requests_per_replica: int = 0
    #: requests served at each load before the version is ready (:mod:`actorserve.warmup`)
    warmup: tuple[Warmup, ...] = ()

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise SettingsError("model settings need a 'name'")
        check_name(self.name)
        check_name(self.version, f"model {self.name!r}: version")
        if self.workers < 1:
            raise SettingsError(f"model {self.name!r}: workers must be >= 1")
        if self.max_batch_size < 0 or self.max_batch_time < 0:
            raise SettingsError(f"model {self.name!r}: batch limits must be >= 0")
        if self.reply_buffer < 1 or self.max_pending < 1:
            raise SettingsError(f"model {self.name!r}: reply_buffer and max_pending must be >= 1")
        if not self.step_timeout >= 0:  # also refuses NaN
            raise SettingsError(f"model {self.name!r}: step_timeout must be >= 0 seconds (0: no deadline)")
        if len(self.warmup) > MAX_WARMUP:
            raise SettingsError(f"model {self.name!r}: at most {MAX_WARMUP} warmup requests")
        if self.max_requests_per_replica < 0:
            raise SettingsError(
                f"model {self.name!r}: max_requests_per_replica must be >= 0 (0: never recycle)"
            )


_TENSOR_KEYS = frozenset({"name", "datatype", "shape", "optional", "parameters"})


def _spec(value: Any, where: str) -> TensorSpec:
    if not isinstance(value, Mapping):
        raise SettingsError(f"{where}: expected a tensor object, got {value!r}")
    unknown = set(value) - _TENSOR_KEYS
    if unknown:
        raise SettingsError(f"{where}: unknown tensor key(s) {', '.join(sorted(unknown))}")
    name, datatype, shape = value.get("name"), value.get("datatype"), value.get("shape")
    optional = value.get("optional", False)
    if not isinstance(name, str) or not name:
        raise SettingsError(f"{where}: a tensor needs a 'name'")
    if not isinstance(datatype, str):
        raise SettingsError(
            f"{where}: tensor {name!r} needs a 'datatype' (an OIP datatype or {ANY_DATATYPE!r})"
        )
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise SettingsError(f"{where}: tensor {name!r} needs a 'shape', a list of integers (-1: any size)")
    if not isinstance(optional, bool):
        raise SettingsError(f"{where}: tensor {name!r}: 'optional' must be true or false")
    try:
        return TensorSpec(name, datatype, tuple(shape), optional)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def _specs(value: Any, where: str) -> tuple[TensorSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SettingsError(f"{where}: expected a list of tensors")
    specs = tuple(_spec(v, where) for v in value)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SettingsError(f"{where}: a tensor name appears twice in {names}")
    return specs


def _request_parameters(value: Any, where: str) -> frozenset[str] | None:
    """The ``request`` block: ``{"parameters": ["name", ...]}``."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"parameters"}:
        raise SettingsError(f"{where}: 'request' must be an object with a 'parameters' list")
    names = value.get("parameters")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise SettingsError(f"{where}: 'request.parameters' must be a list of parameter names")
    return frozenset(names)


def _sequence(block: Mapping[str, Any], where: str) -> SequenceSettings:
    """The ``sequence`` block, each field checked for its type (all integers, but the
    boolean ``evict_idle``)."""
    fields = attrs.fields_dict(SequenceSettings)
    unknown = set(block) - set(fields)
    if unknown:
        raise SettingsError(f"{where}: bad 'sequence' block: unknown field(s) {', '.join(sorted(unknown))}")
    for key, value in block.items():
        if fields[key].type in (bool, "bool"):
            if not isinstance(value, bool):
                raise SettingsError(f"{where}: 'sequence.{key}' must be true or false, not {kind(value)}")
        else:
            whole_number(value, f"{where}: 'sequence.{key}'", SettingsError)
    return SequenceSettings(**block)


def model_settings_from_dict(
    data: Mapping[str, Any], *, folder: Path | None = None, where: str = "settings"
) -> ModelSettings:
    """Build :class:`ModelSettings` from MLServer-shaped JSON data."""
    if not isinstance(data, Mapping):
        raise SettingsError(f"{where}: expected a JSON object")
    known = {
        "name",
        "implementation",
        "parameters",
        "max_batch_size",
        "max_batch_time",
        "workers",
        "sequence",
        "reply_buffer",
        "max_pending",
        "platform",
        "inputs",
        "outputs",
        "versions",
        "request",
        "text_generation",
        "step_timeout",
        "max_requests_per_replica",
        "warmup",
    }
    unknown = set(data) - known
    if unknown:
        raise SettingsError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
    name = data.get("name") or (folder.name if folder else None)
    if not name:
        raise SettingsError(f"{where}: missing 'name'")
    implementation = data.get("implementation")
    if not implementation:
        raise SettingsError(f"{where}: missing 'implementation'")
    if not isinstance(implementation, (str, type)):
        raise SettingsError(f"{where}: 'implementation' must be a string naming a class")
    # Each value is checked for its type, never converted: a list of pairs where an object
    # belongs would become one through dict() and slip past every check made on objects.
    parameters = dict(json_object(data.get("parameters"), f"{where}: 'parameters'", SettingsError))
    sequence = _sequence(json_object(data.get("sequence"), f"{where}: 'sequence'", SettingsError), where)
    versions = data.get("versions") or []
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise SettingsError(f"{where}: 'versions' must be a list of version names")
    version = parameters.get("version") or "1"
    if not isinstance(version, (str, int)) or isinstance(version, bool):
        raise SettingsError(f"{where}: 'parameters.version' must be a string (or an integer)")
    platform = data.get("platform", "")
    if not isinstance(platform, str):
        raise SettingsError(f"{where}: 'platform' must be a string")
    counts = {
        key: whole_number(data.get(key, default), f"{where}: {key!r}", SettingsError)
        for key, default in (
            ("max_batch_size", 0),
            ("workers", 1),
            ("reply_buffer", 64),
            ("max_pending", 1024),
            ("max_requests_per_replica", 0),
        )
    }
    max_batch_time = json_number(data.get("max_batch_time", 0.0), f"{where}: 'max_batch_time'", SettingsError)
    step_timeout = json_number(
        data.get("step_timeout", DEFAULT_STEP_TIMEOUT), f"{where}: 'step_timeout'", SettingsError
    )
    inputs = _specs(data.get("inputs"), f"{where}: inputs")
    outputs = _specs(data.get("outputs"), f"{where}: outputs")
    request_parameters = _request_parameters(data.get("request"), where)
    warmup = warmup_from_json(data.get("warmup"), where, SettingsError)
    text_generation = data.get("text_generation")
    if text_generation is not None:
        json_object(text_generation, f"{where}: 'text_generation'", SettingsError)
        try:
            TextGeneration().with_settings(text_generation)
        except BadInput as exc:
            raise SettingsError(f"{where}: {exc}") from None
    try:
        return ModelSettings(
            name=str(name),
            implementation=implementation,
            version=str(version),
            parameters=parameters,
            max_batch_time=max_batch_time,
            sequence=sequence,
            platform=platform,
            inputs=inputs,
            outputs=outputs,
            versions=tuple(versions),
            folder=folder,
            request_parameters=request_parameters,
            text_generation=text_generation,
            step_timeout=step_timeout,
            warmup=warmup,
            **counts,
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


__all__ = [
    "ANY_DATATYPE",
    "ANY_DATATYPE_SHOWN_AS",
    "DEFAULT_STEP_TIMEOUT",
    "MODEL_SETTINGS_FILE",
    "ModelSettings",
    "SequenceSettings",
    "SettingsError",
    "TensorSpec",
    "discover_models",
    "load_model_settings",
    "model_settings_from_dict",
]
