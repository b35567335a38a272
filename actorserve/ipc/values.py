"""Plain forms of the engine's values, for msgpack: tensors, requests, responses, the
:mod:`actorserve.api` records, and (from :mod:`.failures`) errors. No I/O, no msgpack import.

A plain form is built only of msgpack's own types (None, bool, int, float, str, bytes,
lists, str-keyed maps); nothing is ever pickled. Tensor data travels as raw
little-endian bytes (Triton's raw layout, see :func:`actorserve.raw.tensor_to_raw`).

Encoders raise :class:`~actorserve.errors.BadInput` when a value cannot cross (a tensor
whose data does not fit its shape). Decoders trust nothing: any malformed plain form
raises :class:`WireError`, which the link treats as a broken peer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import attrs
import numpy as np

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
)
from ..codecs import MAX_DIMS
from ..raw import tensor_from_raw, tensor_to_raw
from ..textgen import TextGeneration
from ..types import DATATYPES, InferenceRequest, InferenceResponse, RequestedOutput, Tensor, numpy_dtype
from .failures import DOMAIN_ERRORS, EngineInternalError, WireError, error_from_plain, error_to_plain

Plain = Any  # a msgpack-able value; kept loose on purpose (decoders check shapes)


# -- tensors, requests, responses ------------------------------------------------------


#: numeric OIP datatype -> little-endian numpy dtype (BYTES takes the general decoder)
_RAW_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items() if name != "BYTES"
}


def tensor_to_plain(tensor: Tensor) -> Plain:
    """``[name, datatype, shape, raw bytes, parameters]``; :class:`BadInput` if the data
    does not match the datatype's element count for ``shape``."""
    data = tensor.data
    count = math.prod(tensor.shape)
    if data.size != count:
        raise errors.BadInput(
            f"tensor {tensor.name!r}: shape {list(tensor.shape)} needs {count} elements, data has {data.size}"
        )
    if tensor.datatype != "BYTES":
        dtype = numpy_dtype(tensor.datatype)
        if data.dtype != dtype:  # raw bytes must be the declared width
            tensor = Tensor(
                tensor.name, tensor.shape, tensor.datatype, np.asarray(data, dtype=dtype), tensor.parameters
            )
    return [tensor.name, tensor.datatype, list(tensor.shape), tensor_to_raw(tensor), tensor.parameters]


def tensor_from_plain(plain: Plain) -> Tensor:
    name, datatype, shape, raw, parameters = _fields(plain, 5, "tensor")
    if not isinstance(name, str) or not isinstance(raw, bytes) or not isinstance(shape, list):
        raise WireError(f"malformed tensor {_short(plain)}")
    dtype = _RAW_DTYPES.get(datatype) if isinstance(datatype, str) else None
    # The fast path takes only data-bearing shapes numpy can reshape to; an empty or odd
    # one goes through tensor_from_raw's full shape check (a ValueError is never raised).
    if dtype is not None and raw and len(shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in shape):
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise WireError(f"malformed tensor {name!r}: {len(raw)} bytes for {datatype} {shape}")
        return Tensor(
            name, tuple(shape), datatype, np.frombuffer(raw, dtype).reshape(shape), _map(parameters)
        )
    if datatype == "BYTES" and shape == [1] and int.from_bytes(raw[:4], "little") == len(raw) - 4 >= 0:
        one = np.empty(1, dtype=object)  # one string: a streamed text piece, the common case
        one[0] = raw[4:]
        return Tensor(name, (1,), datatype, one, _map(parameters))
    try:
        return tensor_from_raw(name, datatype, shape, raw, _map(parameters))
    except errors.BadInput as exc:
        raise WireError(f"malformed tensor: {exc}") from None


def request_to_plain(request: InferenceRequest) -> Plain:
    return [
        request.id,
        request.model_name,
        request.model_version,
        request.parameters,
        [tensor_to_plain(t) for t in request.inputs],
        [[o.name, o.parameters] for o in request.outputs],
    ]


def request_from_plain(plain: Plain) -> InferenceRequest:
    request_id, model_name, model_version, parameters, inputs, outputs = _fields(plain, 6, "request")
    return InferenceRequest(
        inputs=[tensor_from_plain(t) for t in _list(inputs)],
        id=_optional_str(request_id),
        parameters=_map(parameters),
        outputs=[
            RequestedOutput(_str(n), _map(p)) for n, p in (_fields(o, 2, "output") for o in _list(outputs))
        ],
        model_name=_optional_str(model_name),
        model_version=_optional_str(model_version),
    )


def response_to_plain(response: InferenceResponse) -> Plain:
    return [
        response.model_name,
        response.model_version,
        response.id,
        response.parameters,
        [tensor_to_plain(t) for t in response.outputs],
    ]


def response_from_plain(plain: Plain) -> InferenceResponse:
    model_name, model_version, response_id, parameters, outputs = _fields(plain, 5, "response")
    return InferenceResponse(
        model_name=_str(model_name),
        outputs=[tensor_from_plain(t) for t in _list(outputs)],
        model_version=_optional_str(model_version),
        id=_optional_str(response_id),
        parameters=_map(parameters),
    )


# -- api records -------------------------------------------------------------------------


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
    replicas = _list_from(lambda p: _scalars(ReplicaDescription, p, "replica", {}))
    description: ModelDescription = _scalars(
        ModelDescription,
        plain,
        "model description",
        {
            "versions": lambda p: tuple(_str(v) for v in _list(p)),
            "replicas": lambda p: tuple(replicas(p)),
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


def _none_to_plain(value: None) -> Plain:
    return None


def _none_from_plain(plain: Plain) -> None:
    if plain is not None:
        raise WireError(f"expected nothing, got {_short(plain)}")


def _bool_from_plain(plain: Plain) -> bool:
    return _bool(plain)


def _list_of(to_plain: Callable[[Any], Plain]) -> Callable[[Any], Plain]:
    return lambda values: [to_plain(v) for v in values]


def _list_from(from_plain: Callable[[Plain], Any]) -> Callable[[Plain], Any]:
    return lambda plain: [from_plain(v) for v in _list(plain)]


#: method name -> (argument names, result to plain, result from plain). The engine side
#: serves exactly these unary calls; ``infer`` and the streams have messages of their own.
UNARY_METHODS: Final[dict[str, tuple[tuple[str, ...], Callable[[Any], Plain], Callable[[Plain], Any]]]] = {
    "ready": ((), bool, _bool_from_plain),
    "models": ((), _list_of(_info_to_plain), _list_from(_info_from_plain)),
    "model_info": (("name", "version"), _info_to_plain, _info_from_plain),
    "metadata": (("name", "version"), _metadata_to_plain, _metadata_from_plain),
    "repository_index": ((), _list_of(_entry_to_plain), _list_from(_entry_from_plain)),
    "statistics": (("name", "version"), _statistics_to_plain, _statistics_from_plain),
    "load_from_repository": (("name", "config"), _none_to_plain, _none_from_plain),
    "set_workers": (("name", "workers", "version", "grace"), _none_to_plain, _none_from_plain),
    "describe": (("name", "version"), _record_to_plain, _description_from_plain),
    "inference_statistics": (
        ("name", "version"),
        _list_of(_record_to_plain),
        _list_from(_inference_statistics_from_plain),
    ),
    "unload": (("name", "version", "grace"), _none_to_plain, _none_from_plain),
    "load_archive": (
        ("path", "name", "handler", "batch_size", "max_batch_delay_ms", "workers"),
        _info_to_plain,
        _info_from_plain,
    ),
    "set_default_version": (("name", "version"), _none_to_plain, _none_from_plain),
    "wait_idle": ((), _none_to_plain, _none_from_plain),
}


# -- checks -----------------------------------------------------------------------------


def _short(plain: Plain) -> str:
    text = repr(plain)
    return text if len(text) < 100 else text[:97] + "..."


def _fields(plain: Plain, count: int, what: str) -> list[Any]:
    if not isinstance(plain, list) or len(plain) != count:
        raise WireError(f"malformed {what}: {_short(plain)}")
    return plain


def _list(plain: Plain) -> list[Any]:
    if not isinstance(plain, list):
        raise WireError(f"expected a list, got {_short(plain)}")
    return plain


def _map(plain: Plain) -> dict[str, Any]:
    if not isinstance(plain, dict):
        raise WireError(f"expected a map, got {_short(plain)}")
    return plain


def _str(plain: Plain) -> str:
    if not isinstance(plain, str):
        raise WireError(f"expected a string, got {_short(plain)}")
    return plain


def _optional_str(plain: Plain) -> str | None:
    return None if plain is None else _str(plain)


def _int(plain: Plain) -> int:
    if isinstance(plain, bool) or not isinstance(plain, int):
        raise WireError(f"expected an integer, got {_short(plain)}")
    return plain


def _bool(plain: Plain) -> bool:
    if not isinstance(plain, bool):
        raise WireError(f"expected a boolean, got {_short(plain)}")
    return plain


def _state(plain: Plain) -> ModelState:
    try:
        return ModelState(plain)
    except ValueError:
        raise WireError(f"unknown model state {_short(plain)}") from None


def plain_default(value: object) -> Plain:
    """msgpack's ``default``: numpy scalars (a model's ``np.int64`` parameter) become
    Python numbers, arrays and sets lists; anything else cannot cross."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} cannot be sent to the other process")


__all__ = [
    "DOMAIN_ERRORS",
    "UNARY_METHODS",
    "EngineInternalError",
    "Plain",
    "WireError",
    "error_from_plain",
    "error_to_plain",
    "plain_default",
    "request_from_plain",
    "request_to_plain",
    "response_from_plain",
    "response_to_plain",
    "tensor_from_plain",
    "tensor_to_plain",
]
