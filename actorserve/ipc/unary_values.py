"""Plain forms of the unary engine calls (:mod:`actorserve.unary`) and of the
:mod:`actorserve.api` records they answer with, for msgpack. No I/O, no msgpack import.

A call crosses as its link name and a map of its record's fields
(:func:`call_to_plain`, the :class:`~.frames.Call` message); the engine side rebuilds
the record, checking each value against its field's annotation (:func:`call_from_plain`:
a bad one fails that call with :class:`~actorserve.errors.BadInput`, as the client's
mistake). Its answer crosses by the codec of the record's result type
(:func:`result_codec`); decoding an answer trusts nothing (:class:`WireError`), as in
:mod:`.values`, whose checks these codecs share.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from .. import errors
from ..api import (
    BatchStatistics,
    Duration,
    InferenceStatistics,
    ModelDescription,
    ModelInfo,
    ModelMetadata,
    ModelState,
    ModelStatistics,
    ReplicaDescription,
    RepositoryEntry,
    TensorMetadata,
    UnaryCall,
)
from ..textgen import TextGeneration
from ..unary import BY_NAME, UNARY_CALLS, result_type
from .values import Plain, WireError, _bool, _fields, _int, _list, _map, _short, _str


def _info_to_plain(info: ModelInfo) -> Plain:
    return [
        info.name,
        info.version,
        str(info.state),
        info.batched,
        info.stream_input,
        info.workers,
        info.max_batch_size,
        info.reason,
        None if info.text_generation is None else info.text_generation.to_plain(),
    ]


def _info_from_plain(plain: Plain) -> ModelInfo:
    name, version, state, batched, stream_input, workers, max_batch_size, reason, text = _fields(
        plain, 9, "model info"
    )
    try:
        text_generation = None if text is None else TextGeneration.from_plain(text)
    except (TypeError, ValueError) as exc:
        raise WireError(f"bad text_generation in model info: {exc}") from None
    return ModelInfo(
        _str(name),
        _str(version),
        _state(state),
        _bool(batched),
        _bool(stream_input),
        _int(workers),
        _int(max_batch_size),
        _str(reason),
        text_generation,
    )


def _spec_to_plain(spec: TensorMetadata) -> Plain:
    return [spec.name, spec.datatype, list(spec.shape), spec.any_datatype]


def _spec_from_plain(plain: Plain) -> TensorMetadata:
    name, datatype, shape, any_datatype = _fields(plain, 4, "tensor metadata")
    return TensorMetadata(
        _str(name), _str(datatype), tuple(_int(d) for d in _list(shape)), _bool(any_datatype)
    )


def _metadata_to_plain(meta: ModelMetadata) -> Plain:
    return [
        meta.name,
        list(meta.versions),
        meta.platform,
        [_spec_to_plain(s) for s in meta.inputs],
        [_spec_to_plain(s) for s in meta.outputs],
        dict(meta.parameters),
    ]


def _metadata_from_plain(plain: Plain) -> ModelMetadata:
    name, versions, platform, inputs, outputs, parameters = _fields(plain, 6, "model metadata")
    return ModelMetadata(
        _str(name),
        tuple(_str(v) for v in _list(versions)),
        _str(platform),
        tuple(_spec_from_plain(s) for s in _list(inputs)),
        tuple(_spec_from_plain(s) for s in _list(outputs)),
        {_str(k): v if isinstance(v, bool) else _str(v) for k, v in _map(parameters).items()},
    )


def _entry_to_plain(entry: RepositoryEntry) -> Plain:
    return [entry.name, entry.version, str(entry.state), entry.reason]


def _entry_from_plain(plain: Plain) -> RepositoryEntry:
    name, version, state, reason = _fields(plain, 4, "repository entry")
    return RepositoryEntry(_str(name), _str(version), _state(state), _str(reason))


_STAT_COUNTERS: Final = (
    "inflight",
    "waiting",
    "running",
    "steps",
    "items_stepped",
    "open_sequences",
    "sequences_started",
    "queued",
)


def _statistics_to_plain(stats: ModelStatistics) -> Plain:
    return [
        stats.name,
        stats.version,
        *(getattr(stats, c) for c in _STAT_COUNTERS),
        dict(stats.sequences_ended),
    ]


def _statistics_from_plain(plain: Plain) -> ModelStatistics:
    name, version, *counters, ended = _fields(plain, 3 + len(_STAT_COUNTERS), "statistics")
    ended_map = _map(ended)
    return ModelStatistics(
        _str(name),
        _str(version),
        **{c: _int(v) for c, v in zip(_STAT_COUNTERS, counters, strict=True)},
        sequences_ended={_str(k): _int(v) for k, v in ended_map.items()},
    )


def _record_to_plain(record: Any) -> Plain:
    """A record of :mod:`actorserve.descriptions` as nested lists, in field order."""
    return attrs.astuple(record)


def _scalars(cls: type, plain: Plain, what: str, nested: dict[str, Callable[[Plain], Any]]) -> Any:
    """``cls`` from its plain list: each scalar field checked by its annotation
    (``str``, ``int``, ``bool``, ``float``), the fields in ``nested`` by their function."""
    fields = attrs.fields(cls)
    values = {}
    for field, value in zip(fields, _fields(plain, len(fields), what), strict=True):
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
        if field.name in nested:
            values[field.name] = nested[field.name](value)
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise WireError(f"malformed {what}: {field.name} is not a number")
            values[field.name] = float(value)
        else:
            values[field.name] = {"str": _str, "int": _int, "bool": _bool}[kind](value)
    return cls(**values)


def _duration(plain: Plain) -> Duration:
    return Duration(*(_int(v) for v in _fields(plain, 2, "duration")))


def _description_from_plain(plain: Plain) -> ModelDescription:
    description: ModelDescription = _scalars(
        ModelDescription,
        plain,
        "model description",
        {
            "versions": lambda p: tuple(_str(v) for v in _list(p)),
            "replicas": lambda p: tuple(_scalars(ReplicaDescription, r, "replica", {}) for r in _list(p)),
        },
    )
    return description


def _batch(plain: Plain) -> BatchStatistics:
    size, compute = _fields(plain, 2, "batch statistics")
    return BatchStatistics(_int(size), _duration(compute))


def _inference_statistics_from_plain(plain: Plain) -> InferenceStatistics:
    nested: dict[str, Callable[[Plain], Any]] = {
        d: _duration for d in ("success", "fail", "queue", "compute_infer")
    }
    nested["batches"] = lambda p: tuple(_batch(b) for b in _list(p))
    stats: InferenceStatistics = _scalars(InferenceStatistics, plain, "inference statistics", nested)
    return stats


def _state(plain: Plain) -> ModelState:
    try:
        return ModelState(plain)
    except ValueError:
        raise WireError(f"unknown model state {_short(plain)}") from None


def _none_to_plain(value: None) -> Plain:
    return None


def _none_from_plain(plain: Plain) -> None:
    if plain is not None:
        raise WireError(f"expected nothing, got {_short(plain)}")


Codec = tuple[Callable[[Any], Plain], Callable[[Plain], Any]]

#: result type -> (to plain, from plain); a ``list[X]`` result takes X's codec per item
_CODECS: Final[dict[Any, Codec]] = {
    type(None): (_none_to_plain, _none_from_plain),
    bool: (bool, lambda plain: _bool(plain)),
    int: (int, lambda plain: _int(plain)),
    str: (str, lambda plain: _str(plain)),
    ModelInfo: (_info_to_plain, _info_from_plain),
    ModelMetadata: (_metadata_to_plain, _metadata_from_plain),
    RepositoryEntry: (_entry_to_plain, _entry_from_plain),
    ModelStatistics: (_statistics_to_plain, _statistics_from_plain),
    ModelDescription: (_record_to_plain, _description_from_plain),
    InferenceStatistics: (_record_to_plain, _inference_statistics_from_plain),
}


def _codec(result: Any) -> Codec:
    if typing.get_origin(result) is not list:
        return _CODECS[result]
    to_plain, from_plain = _CODECS[typing.get_args(result)[0]]
    return (lambda values: [to_plain(v) for v in values]), (
        lambda plain: [from_plain(v) for v in _list(plain)]
    )


#: unary call record -> the codec of its answer, made once (a KeyError at import: a
#: record whose result type has no codec above)
_RESULTS: Final[dict[type[UnaryCall[Any]], Codec]] = {
    record: _codec(result_type(record)) for record in UNARY_CALLS
}


def result_codec(record: type[UnaryCall[Any]]) -> Codec:
    """(to plain, from plain) of the answer to a unary call, by its record's result type
    (:func:`actorserve.unary.result_type`); the decoder raises :class:`WireError`."""
    codec = _RESULTS.get(record)
    return _codec(result_type(record)) if codec is None else codec


def call_to_plain(request: UnaryCall[Any]) -> tuple[str, dict[str, Plain]]:
    """A unary call as its link name and its fields (the :class:`~.frames.Call` message)."""
    row = UNARY_CALLS[type(request)]
    return row.name, {
        argument.name: dict(value) if isinstance(value := getattr(request, argument.name), Mapping) else value
        for argument in _arguments(row.record)
    }


def call_from_plain(name: str, args: Mapping[str, Plain]) -> UnaryCall[Any]:
    """The record a front sent; :class:`BadInput` (that call fails, the link stays) for
    an unknown method, an unknown or missing field, or a value its annotation refuses."""
    row = BY_NAME.get(name)
    if row is None:
        raise errors.BadInput(f"the engine has no method {name!r}")
    arguments = _arguments(row.record)
    unexpected = args.keys() - {argument.name for argument in arguments}
    if unexpected:
        raise errors.BadInput(f"{name}: unexpected arguments {sorted(unexpected)}")
    values = {}
    for argument in arguments:
        if argument.name in args:
            values[argument.name] = argument.checked(name, args[argument.name])
        elif argument.required:
            raise errors.BadInput(f"{name}: {argument.name} is required")
    return typing.cast(UnaryCall[Any], row.record(**values))


#: a record field's annotation (less ``| None``) -> (what it must be, the check)
_CHECKS: Final[dict[str, tuple[str, Callable[[Plain], bool]]]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "bool": ("a boolean", lambda v: isinstance(v, bool)),
    "Mapping[str, Any]": ("a map", lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v)),
}


@attrs.frozen
class _Argument:
    """A record's field as the link checks it."""

    name: str
    required: bool
    #: None is allowed (the annotation ends ``| None``)
    optional: bool
    what: str
    check: Callable[[Plain], bool]

    def checked(self, method: str, value: Plain) -> Plain:
        if (value is None and self.optional) or (value is not None and self.check(value)):
            return value
        nil = " or nil" if self.optional else ""
        raise errors.BadInput(f"{method}: {self.name} must be {self.what}{nil}, got {_short(value)}")


def _read_arguments(record: type[Any]) -> tuple[_Argument, ...]:
    arguments = []
    for field in attrs.fields(record):
        annotation = str(field.type)
        what, check = _CHECKS[annotation.removesuffix(" | None")]
        required = field.default is attrs.NOTHING
        arguments.append(_Argument(field.name, required, annotation.endswith(" | None"), what, check))
    return tuple(arguments)


#: unary call record -> its fields as the link checks them, read once (a KeyError at
#: import: a field whose annotation the link cannot check)
_ARGUMENTS: Final[dict[type[UnaryCall[Any]], tuple[_Argument, ...]]] = {
    record: _read_arguments(record) for record in UNARY_CALLS
}


def _arguments(record: type[Any]) -> tuple[_Argument, ...]:
    arguments = _ARGUMENTS.get(record)
    return _read_arguments(record) if arguments is None else arguments


__all__ = ["call_from_plain", "call_to_plain", "result_codec"]
