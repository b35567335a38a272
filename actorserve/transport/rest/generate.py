"""Triton's generate extension, with no I/O: ``{"text_input": ..., "parameters": {...}}``
bodies and ``EventSource`` query strings as engine requests, and responses as
``{"model_name", "model_version", "text_output", ...}``.

A generate body with ``"inputs"`` is OIP (MLServer's alias of infer) and is decoded as
infer is. Errors are :class:`BadInput`.

Triton's shape is the text-generation contract's own (:mod:`actorserve.textgen`):
``text_input`` is the prompt tensor, ``parameters`` go to the model as they are, and
``text_output`` carries the pieces, the last response saying ``finish_reason``; so a text
model needs no translation here, while the OpenAI routes translate to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import numpy as np

from ...codecs import tensor_from_list
from ...errors import BadInput
from ...limits import MAX_INPUTS, BytesElements, check_count, check_parameters
from ...textgen import element_text, text_tensor
from ...types import InferenceRequest, InferenceResponse, Tensor
from .wire import RequestHeaders, decode_infer_request, encode_oip, json_bytes, loads

Encoder = Callable[[InferenceResponse], bytes]

_GENERATE_RESERVED: Final = frozenset({"id", "parameters"})


def _infer_datatype(name: str, values: list[object]) -> str:
    if not values:
        raise BadInput(f"input {name!r}: cannot tell the datatype of an empty list")
    if all(isinstance(v, str) for v in values):
        return "BYTES"
    if all(isinstance(v, bool) for v in values):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "INT64"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "FP64"
    raise BadInput(f"input {name!r}: expected strings, booleans or numbers, got {values[:3]!r}")


def _flat(value: object) -> list[object]:
    if not isinstance(value, list):
        return [value]
    out: list[object] = []
    for item in value:
        out.extend(_flat(item))
    return out


def generate_tensor(
    name: str, value: object, datatypes: Mapping[str, str], budget: BytesElements | None = None
) -> Tensor:
    """A top-level value of a generate request as a tensor: a scalar is shape [1], a
    (nested) list keeps its shape; the datatype comes from the model's metadata, else
    from the values (str: BYTES, bool: BOOL, int: INT64, float: FP64). ``budget``: the
    request's BYTES elements (:data:`~actorserve.limits.MAX_BYTES_ELEMENTS`)."""
    if isinstance(value, dict) or value is None:
        raise BadInput(f"input {name!r}: expected a string, a number, a boolean or a list of them")
    if isinstance(value, list):
        try:
            shape = [int(d) for d in np.shape(np.array(value, dtype=object))]
        except ValueError:
            raise BadInput(f"input {name!r}: data is a ragged nested list") from None
        data = value
    else:
        shape, data = [1], [value]
    datatype = datatypes.get(name) or _infer_datatype(name, _flat(value))
    return tensor_from_list(name, datatype, shape, data, budget=budget)


def generate_request_from_json(obj: dict[str, Any], datatypes: Mapping[str, str]) -> InferenceRequest:
    """Triton's generate request ``{"id"?, "text_input": ..., "parameters"?: {...}, ...}``:
    every top-level key but ``id`` and ``parameters`` becomes an input tensor.
    ``datatypes``: the model's declared input name -> datatype ("" for any)."""
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInput("'id' must be a string")
    parameters = obj.get("parameters")
    if parameters is None:
        parameters = {}
    elif not isinstance(parameters, dict):
        raise BadInput("'parameters' must be a JSON object")
    check_parameters(parameters, "request")
    names = [k for k in obj if k not in _GENERATE_RESERVED]
    check_count(names, MAX_INPUTS, "inputs", "MAX_INPUTS")
    budget = BytesElements()
    inputs = [generate_tensor(k, obj[k], datatypes, budget) for k in names]
    return InferenceRequest(inputs=inputs, id=request_id, parameters=parameters)


def parse_generate_body(
    body: bytes, headers: RequestHeaders
) -> tuple[InferenceRequest, Encoder] | dict[str, Any]:
    """A generate body: OIP tensors are decoded here (answered as OIP, like infer);
    Triton's shape comes back as its JSON object, for :func:`generate_request_from_json`
    once the caller has the model's input datatypes."""
    if headers.inference_header_length is not None:
        return decode_infer_request(body, headers)[0], encode_oip
    obj = loads(body)
    if not isinstance(obj, dict) or "inputs" in obj:
        return decode_infer_request(body, headers, obj=obj)[0], encode_oip
    return obj


_INT: Final = re.compile(r"[+-]?\d+")


def query_value(text: str) -> Any:
    """A query-string value as JSON would have it: bools, ints and finite floats are
    parsed, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.fullmatch(text.strip()):
        return int(text)
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def generate_request_from_query(
    args: Iterable[tuple[str, list[str]]], datatypes: Mapping[str, str]
) -> InferenceRequest:
    """``GET .../generate_stream?text_input=...&n_tokens=3``: ``text_input`` and the
    model's declared inputs become tensors (text stays text for BYTES inputs, other values
    are parsed as for parameters), ``id`` is the request id, any other key a parameter."""
    inputs: list[Tensor] = []
    parameters: dict[str, Any] = {}
    request_id: str | None = None
    for key, raw_values in args:
        if key == "id":
            request_id = raw_values[-1]
        elif key == "text_input" and len(raw_values) == 1 and datatypes.get(key, "BYTES") == "BYTES":
            inputs.append(text_tensor(key, raw_values[0]))  # the contract's prompt tensor
        elif key == "text_input" or key in datatypes:
            datatype = datatypes.get(key) or ("BYTES" if key == "text_input" else "")
            values: list[Any] = raw_values if datatype == "BYTES" else [query_value(v) for v in raw_values]
            datatype = datatype or _infer_datatype(key, values)
            inputs.append(tensor_from_list(key, datatype, [len(values)], values))
        else:
            parsed = [query_value(v) for v in raw_values]
            parameters[key] = parsed[0] if len(parsed) == 1 else parsed
    return InferenceRequest(inputs=inputs, id=request_id, parameters=parameters)


def generate_response_to_json(response: InferenceResponse) -> dict[str, Any]:
    """Triton's generate response: ``{"id"?, "model_name", "model_version", <output>: ...}``
    with BYTES as text, shape-[1] outputs as scalars and others as (nested) lists."""
    out: dict[str, Any] = {}
    if response.id is not None:
        out["id"] = response.id
    out["model_name"] = response.model_name
    out["model_version"] = response.model_version
    for tensor in response.outputs:
        out[tensor.name] = generate_value(tensor)
    out.update(usage_fields(response.parameters))
    return out


#: the response parameters a generate document shows when the request asked for
#: ``usage`` (the model then reports its counts): the token counts and why it ended
USAGE_KEYS: Final = ("prompt_tokens", "completion_tokens", "finish_reason")


def usage_fields(parameters: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The usage of a response (:data:`USAGE_KEYS` it holds), when it reports counts."""
    if "completion_tokens" not in parameters:
        return []
    return [(key, parameters[key]) for key in USAGE_KEYS if key in parameters]


def generate_value(tensor: Tensor) -> Any:
    """One output in a generate response: BYTES as text, shape-[1] as a scalar, others
    as (nested) lists."""
    scalar = tensor.data.size == 1 and len(tensor.shape) <= 1
    if tensor.datatype == "BYTES":
        texts = [element_text(v) for v in tensor.data.reshape(-1)]
        if scalar:
            return texts[0]
        array = np.empty(len(texts), dtype=object)
        array[:] = texts
        return array.reshape(tensor.shape).tolist()
    return tensor.data.reshape(-1)[0].item() if scalar else tensor.data.tolist()


def encode_generate(response: InferenceResponse) -> bytes:
    return json_bytes(generate_response_to_json(response))


def encode_event_source(response: InferenceResponse) -> bytes:
    """A GET stream's event names its sequence too: ``EventSource`` cannot read headers."""
    doc = generate_response_to_json(response)
    if "sequence_id" in response.parameters:
        doc["sequence_id"] = response.parameters["sequence_id"]
    return json_bytes(doc)
