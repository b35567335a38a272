"""Conversions between OIP tensors and JSON values, numpy and torch (raw bytes:
:mod:`actorserve.raw`).

Every decoder validates and raises :class:`~actorserve.errors.BadInput` with a message
that names the tensor and says what was expected. Numeric data never goes through
per-element Python loops: JSON lists are converted by numpy in C, raw bytes with
``numpy.frombuffer``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from .errors import BadInput
from .jsonbytes import BYTES_FRAGMENT_ELEMENTS, bytes_array, bytes_element, bytes_json, bytes_to_text
from .jsonpacked import NumberText
from .limits import MAX_DIMS, MAX_INPUTS, BytesElements, check_count, check_parameters
from .packedbytes import PackedBytes
from .types import (
    DATATYPES,
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    Tensor,
    datatype_of,
    numpy_dtype,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_DIMS",
    "MAX_EXTENT",
    "check_shape",
    "element_count",
    "parameters_from_json",
    "request_from_json",
    "request_to_json",
    "response_from_json",
    "response_to_json",
    "tensor_from_json",
    "tensor_from_list",
    "tensor_from_numpy",
    "tensor_from_torch",
    "tensor_to_json",
    "tensor_to_torch",
]

# numpy dtype kinds that a JSON array may decode to, per OIP datatype kind.
_ACCEPTED_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf", "O": ""}


#: Largest product of a shape's non-zero dimensions. numpy refuses a shape whose extent
#: times the item size overflows, even with a zero dimension (``[0, 2**62]``); this bound
#: keeps every datatype far below that, and far above any tensor a body can carry.
MAX_EXTENT: Final = 2**48


def check_shape(name: str, shape: object) -> tuple[int, ...]:
    """Validate a shape: at most :data:`MAX_DIMS` non-negative integers whose non-zero
    product is at most :data:`MAX_EXTENT`. Checked before anything is allocated."""
    if not isinstance(shape, (list, tuple)):
        raise BadInput(f"input {name!r}: shape must be a list of integers, got {_short(shape)}")
    if len(shape) > MAX_DIMS:
        raise BadInput(f"input {name!r}: shape has {len(shape)} dimensions; at most {MAX_DIMS} are allowed")
    extent = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise BadInput(f"input {name!r}: shape must be a list of integers, got {_short(shape)}")
        if dim < 0:
            raise BadInput(f"input {name!r}: negative dimension {dim} in shape {list(shape)}")
        extent *= dim or 1
        if extent > MAX_EXTENT:
            raise BadInput(
                f"input {name!r}: shape {_short(list(shape))} is too large (the product of its "
                f"non-zero dimensions must be at most 2**48)"
            )
    return tuple(shape)


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _flatten(name: str, value: object, out: list[object]) -> None:
    """Append the leaves of nested lists to ``out``, row-major. Iterative and bounded by
    :data:`MAX_DIMS` levels: data nested deeper than any shape is refused, never a
    RecursionError."""
    stack = [iter(value)] if isinstance(value, list) else []
    if not stack:
        out.append(value)
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= MAX_DIMS:
                    raise BadInput(f"input {name!r}: data is nested more than {MAX_DIMS} lists deep")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()


def tensor_from_list(
    name: str,
    datatype: str,
    shape: Sequence[int],
    data: object,
    parameters: Mapping[str, Any] | None = None,
    budget: BytesElements | None = None,
) -> Tensor:
    """Build a tensor from JSON ``data`` (flat, or nested row-major) and check it.
    ``budget``: the request's BYTES element count, which a BYTES tensor's shape is added
    to before any element is converted. BYTES ``data`` lists are converted in place (each
    ``str`` replaced by its UTF-8 ``bytes``, so the parsed JSON never holds both)."""
    dims = check_shape(name, shape)
    dtype = numpy_dtype(datatype)
    expected = element_count(dims)
    if isinstance(data, PackedBytes):  # strings packed as parsed (jsonpacked)
        if datatype == "BYTES":
            (budget or BytesElements()).add(expected, name)
        if len(data) != expected:
            raise _count_mismatch(name, dims, expected, len(data))
        if datatype != "BYTES":
            raise BadInput(f"input {name!r}: {datatype} data must hold {_kind_word(dtype.kind)}, got strings")
        return Tensor(name, dims, datatype, data, dict(parameters or {}))
    if isinstance(data, NumberText):  # numbers as parsed text (jsonpacked)
        return _tensor_from_text(name, datatype, dims, data, parameters, budget)
    if not isinstance(data, list):
        raise BadInput(f"input {name!r}: data must be a list, got {type(data).__name__}")
    if datatype == "BYTES":
        (budget or BytesElements()).add(expected, name)
        array, count = bytes_array(name, data, expected)
        if count != expected:
            raise _count_mismatch(name, dims, expected, count)
        return Tensor(name, dims, datatype, array.reshape(dims), dict(parameters or {}))
    try:
        probe = np.array(data)
    except ValueError:
        raise BadInput(f"input {name!r}: data is a ragged nested list") from None
    if probe.size != expected:
        raise _count_mismatch(name, dims, expected, probe.size)
    if probe.size and probe.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        exact = _exact_integers(name, datatype, dtype, data, dims) if dtype.kind in "iu" else None
        if exact is not None:
            return Tensor(name, dims, datatype, exact, dict(parameters or {}))
        raise BadInput(
            f"input {name!r}: {datatype} data must hold {_kind_word(dtype.kind)}, got {_describe(probe)}"
        )
    try:
        array = probe.astype(dtype, casting="unsafe", copy=False) if probe.size else np.empty(0, dtype)
        if probe.size and dtype.kind in "iu" and probe.dtype.kind in "iu":
            # astype wraps silently; a value out of range is the client's mistake.
            info = np.iinfo(dtype)
            if probe.min() < info.min or probe.max() > info.max:
                raise OverflowError
    except OverflowError:
        raise BadInput(f"input {name!r}: a value is out of range for {datatype}") from None
    return Tensor(name, dims, datatype, array.reshape(dims), dict(parameters or {}))


def _tensor_from_text(
    name: str,
    datatype: str,
    dims: tuple[int, ...],
    data: NumberText,
    parameters: Mapping[str, Any] | None,
    budget: BytesElements | None,
) -> Tensor:
    """:func:`tensor_from_list` of numbers kept as their JSON text: each slice of them
    parsed and converted on its own, into the one array (never a list of every value)."""
    expected = element_count(dims)
    if datatype == "BYTES":
        (budget or BytesElements()).add(expected, name)
    if len(data) != expected:
        raise _count_mismatch(name, dims, expected, len(data))
    array = np.empty(expected, numpy_dtype(datatype))
    filled = 0
    for values in data.chunks():
        if datatype == "BYTES":
            bytes_element(name, values[0])  # refused: a BYTES element is a string
        array[filled : filled + len(values)] = tensor_from_list(name, datatype, [len(values)], values).data
        filled += len(values)
    return Tensor(name, dims, datatype, array.reshape(dims), dict(parameters or {}))


def _exact_integers(
    name: str, datatype: str, dtype: np.dtype[Any], data: list[Any], dims: tuple[int, ...]
) -> npt.NDArray[Any] | None:
    """Slow path for integers numpy could not type on its own (e.g. 0 and 2**63 in one
    UINT64 list make float64). None if the elements are not all integers."""
    flat: list[object] = []
    _flatten(name, data, flat)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return None
    info = np.iinfo(dtype)
    if any(not info.min <= v <= info.max for v in flat):  # type: ignore[operator]
        raise BadInput(f"input {name!r}: a value is out of range for {datatype}")
    return np.array(flat, dtype=dtype).reshape(dims)


def _count_mismatch(name: str, shape: tuple[int, ...], expected: int, got: int) -> BadInput:
    return BadInput(f"input {name!r}: shape {list(shape)} needs {expected} elements, data has {got}")


def _kind_word(kind: str) -> str:
    return {"b": "booleans", "u": "integers", "i": "integers", "f": "numbers"}.get(kind, "?")


def _describe(probe: npt.NDArray[Any]) -> str:
    kind = probe.dtype.kind
    if kind in "US":
        return "strings"
    if kind == "f":
        return "floating-point numbers"
    if kind in "iu":
        return "integers"
    if kind == "b":
        return "booleans"
    return "mixed or non-numeric values"


def tensor_from_json(obj: object, *, what: str = "input", budget: BytesElements | None = None) -> Tensor:
    """Decode one OIP JSON tensor ``{"name", "shape", "datatype", "data", "parameters"?}``
    (``budget``: see :func:`tensor_from_list`)."""
    if not isinstance(obj, dict):
        raise BadInput(f"each {what} must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str):
        raise BadInput(f"{what} without a string 'name': {_short(obj)}")
    if "shape" not in obj:
        raise BadInput(f"{what} {name!r}: missing 'shape'")
    if "datatype" not in obj:
        raise BadInput(f"{what} {name!r}: missing 'datatype'")
    if "data" not in obj:
        raise BadInput(f"{what} {name!r}: missing 'data'")
    parameters = parameters_from_json(obj.get("parameters"), where=f"{what} {name!r}")
    return tensor_from_list(name, obj["datatype"], obj["shape"], obj["data"], parameters, budget)


def _short(obj: object) -> str:
    text = repr(obj)
    return text if len(text) < 120 else text[:117] + "..."


def parameters_from_json(value: object, *, where: str = "request") -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"{where}: 'parameters' must be a JSON object")
    check_parameters(value, where)
    return value


def tensor_to_json(tensor: Tensor) -> dict[str, Any]:
    """Encode a tensor as OIP JSON. Numeric data stays a numpy array (orjson writes it);
    BYTES data of more than :data:`BYTES_FRAGMENT_ELEMENTS` elements is already JSON
    text, an ``orjson.Fragment`` (only orjson writes it)."""
    data: Any
    packed = tensor.packed
    if packed is not None:  # one buffer, written without a Python object per element
        data = orjson.Fragment(packed.to_json())
    elif tensor.datatype == "BYTES" and tensor.data.size > BYTES_FRAGMENT_ELEMENTS:
        data = orjson.Fragment(bytes_json(tensor.data.reshape(-1)))
    elif tensor.datatype == "BYTES":
        data = [bytes_to_text(v) for v in tensor.data.reshape(-1)]
    else:
        data = np.ascontiguousarray(tensor.data).reshape(-1)
    out: dict[str, Any] = {
        "name": tensor.name,
        "shape": list(tensor.shape),
        "datatype": tensor.datatype,
        "data": data,
    }
    if tensor.parameters:
        out["parameters"] = tensor.parameters
    return out


def request_from_json(obj: object, budget: BytesElements | None = None) -> InferenceRequest:
    """Decode an OIP request body (already parsed JSON); ``budget``: the BYTES elements
    the request's other inputs (binary ones) hold already."""
    if not isinstance(obj, dict):
        raise BadInput(f"the request body must be a JSON object, got a JSON {_json_kind(obj)}")
    inputs = obj.get("inputs")
    if inputs is None:
        raise BadInput("the request has no 'inputs'")
    if not isinstance(inputs, list):
        raise BadInput(f"'inputs' must be a list, got a JSON {_json_kind(inputs)}")
    check_count(inputs, MAX_INPUTS, "inputs", "MAX_INPUTS")
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInput("'id' must be a string")
    outputs_obj = obj.get("outputs") or []
    if not isinstance(outputs_obj, list):
        raise BadInput("'outputs' must be a list")
    check_count(outputs_obj, MAX_INPUTS, "requested outputs", "MAX_INPUTS")
    outputs = []
    for out in outputs_obj:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise BadInput("each requested output must be an object with a string 'name'")
        where = f"output {_short(out['name'])}"
        outputs.append(RequestedOutput(out["name"], parameters_from_json(out.get("parameters"), where=where)))
    budget = budget or BytesElements()
    return InferenceRequest(
        inputs=[tensor_from_json(t, budget=budget) for t in inputs],
        id=request_id,
        parameters=parameters_from_json(obj.get("parameters")),
        outputs=outputs,
    )


def _json_kind(obj: object) -> str:
    if isinstance(obj, list):
        return "array"
    if isinstance(obj, str):
        return "string"
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, (int, float)):
        return "number"
    return "object"


def request_to_json(request: InferenceRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"inputs": [tensor_to_json(t) for t in request.inputs]}
    if request.id is not None:
        out["id"] = request.id
    if request.parameters:
        out["parameters"] = request.parameters
    if request.outputs:
        out["outputs"] = [
            {"name": o.name, **({"parameters": o.parameters} if o.parameters else {})}
            for o in request.outputs
        ]
    return out


def response_to_json(response: InferenceResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"model_name": response.model_name}
    if response.model_version is not None:
        out["model_version"] = response.model_version
    if response.id is not None:
        out["id"] = response.id
    if response.parameters:
        out["parameters"] = response.parameters
    out["outputs"] = [tensor_to_json(t) for t in response.outputs]
    return out


def response_from_json(obj: Mapping[str, Any]) -> InferenceResponse:
    return InferenceResponse(
        model_name=obj["model_name"],
        model_version=obj.get("model_version"),
        id=obj.get("id"),
        parameters=dict(obj.get("parameters") or {}),
        outputs=[tensor_from_json(t, what="output") for t in obj.get("outputs", [])],
    )


def tensor_from_numpy(
    name: str,
    array: npt.ArrayLike,
    datatype: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Tensor:
    """Wrap a numpy array (or anything numpy accepts) as a tensor of ``datatype``.

    Without ``datatype`` it is inferred from the array; str elements become UTF-8 bytes.
    """
    arr = np.asarray(array)
    dt = datatype or datatype_of(arr)
    if dt == "BYTES":
        if arr.dtype != object or any(not isinstance(v, bytes) for v in arr.reshape(-1)):
            flat = [bytes_element(name, v) for v in arr.reshape(-1).tolist()]
            out = np.empty(len(flat), dtype=object)
            out[:] = flat
            arr = out.reshape(arr.shape)
    else:
        target = numpy_dtype(dt)
        if arr.dtype != target:
            arr = arr.astype(target)
    return Tensor(name, tuple(int(d) for d in arr.shape), dt, arr, dict(parameters or {}))


def tensor_from_torch(name: str, value: torch.Tensor, parameters: Mapping[str, Any] | None = None) -> Tensor:
    """Copy a torch tensor (any device) into an OIP tensor."""
    return tensor_from_numpy(name, value.detach().cpu().numpy(), parameters=parameters)


def tensor_to_torch(tensor: Tensor, device: str | torch.device | None = None) -> torch.Tensor:
    """A torch tensor with the tensor's data; BYTES cannot be converted."""
    import torch

    if tensor.datatype == "BYTES":
        raise BadInput(f"input {tensor.name!r}: BYTES tensors have no torch equivalent")
    if tensor.datatype in ("UINT16", "UINT32", "UINT64"):
        # torch has limited unsigned support; widen to the next signed type.
        data = tensor.data.astype(np.int64)
    else:
        data = tensor.data
    return torch.from_numpy(np.array(data, copy=True)).to(device or "cpu")


assert set(_ACCEPTED_KINDS) >= {dt.kind for dt in DATATYPES.values()}
