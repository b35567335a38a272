"""The REST wire format, with no I/O: request headers, OIP bodies (JSON and Triton's
binary tensor extension), ``sequence-*`` headers, infer responses, JSON error replies
and gzip.

Nothing here imports a web framework, trio or hypercorn: every function takes and
returns bytes and plain records, so it is tested with plain bytes. Errors are domain
errors (:class:`BadInput`), or :class:`BodyTooLarge` for a body over the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import orjson

from ...api import bool_parameter, no_sequence_text, with_control
from ...codecs import request_from_json, response_to_json
from ...errors import ActorServeError, BadInput
from ...jsonpacked import loads_packed
from ...limits import MAX_INPUTS, BytesElements, check_count, check_json_containers, check_parameters
from ...raw import tensor_from_raw, tensor_to_raw
from ...types import InferenceRequest, InferenceResponse, Tensor
from .. import compression
from ..errors import RETRY_AFTER_SECONDS, BodyTooLarge, client_message, http_status
from .sequence_headers import OIP, SequenceNaming

log = logging.getLogger(__name__)

#: Request parameters that steer the transport's encoding; they never reach the engine.
TRANSPORT_PARAMETERS: Final = frozenset({"binary_data_size", "binary_data", "binary_data_output"})

#: Header -> request parameter, for stateful sequences over REST.
SEQUENCE_HEADERS: Final = {
    "sequence-id": "sequence_id",
    "sequence-start": "sequence_start",
    "sequence-end": "sequence_end",
    "sequence-cancel": "sequence_cancel",
}

#: Bodies at least this large are gzipped in a worker thread, off the event loop.
GZIP_IN_THREAD_BYTES: Final = 256 * 1024

JSON_CONTENT_TYPE: Final = "application/json"
BINARY_CONTENT_TYPE: Final = "application/octet-stream"

Headers = list[tuple[str, str]]


# -- request headers ---------------------------------------------------------------------


@attrs.frozen(slots=True)
class RequestHeaders:
    """The request headers the transport acts on."""

    content_length: str | None = None
    content_encoding: str | None = None
    accept_encoding: str | None = None
    inference_header_length: str | None = None
    #: (request parameter, header value) for each ``sequence-*`` header sent.
    sequence: tuple[tuple[str, str], ...] = ()
    #: which header carries the sequence id, and how answers name it (``--sequence-headers``)
    naming: SequenceNaming = OIP

    @classmethod
    def from_asgi(cls, raw: Iterable[tuple[bytes, bytes]], naming: SequenceNaming = OIP) -> RequestHeaders:
        """From an ASGI scope's header list (names are lower-case there)."""
        values: dict[str, str] = {}
        for name, value in raw:
            key = name.decode("latin-1")
            if key in _WANTED_HEADERS or key == naming.request:
                values[key] = value.decode("latin-1")
        return cls._from_values(values, naming)

    @classmethod
    def from_lookup(cls, get: Callable[[str], str | None], naming: SequenceNaming = OIP) -> RequestHeaders:
        """From a case-insensitive lookup such as Quart's ``request.headers.get``."""
        wanted = (*_WANTED_HEADERS, naming.request)
        values = {key: value for key in wanted if (value := get(key)) is not None}
        return cls._from_values(values, naming)

    @classmethod
    def _from_values(cls, values: dict[str, str], naming: SequenceNaming) -> RequestHeaders:
        if not values and naming is OIP:
            return _NO_HEADERS
        # the preset's id header stands in for sequence-id (one routing key, never two)
        names = {**SEQUENCE_HEADERS, naming.request: "sequence_id"}
        if naming.request != "sequence-id":
            del names["sequence-id"]
        return cls(
            content_length=values.get("content-length"),
            content_encoding=values.get("content-encoding"),
            accept_encoding=values.get("accept-encoding"),
            inference_header_length=values.get("inference-header-content-length"),
            sequence=tuple((param, values[header]) for header, param in names.items() if header in values),
            naming=naming,
        )


_WANTED_HEADERS: Final = frozenset(
    {
        "content-length",
        "content-encoding",
        "accept-encoding",
        "inference-header-content-length",
        *SEQUENCE_HEADERS,
    }
)
_NO_HEADERS: Final = RequestHeaders()


# -- replies and errors ------------------------------------------------------------------


@attrs.frozen(slots=True)
class HttpReply:
    """A complete (non-streaming) HTTP answer, independent of the web framework."""

    status: int
    headers: Headers
    body: bytes


def json_bytes(value: Any) -> bytes:
    """JSON as orjson writes it (never a raw line break: SSE frames rely on that)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def json_reply(value: Any, status: int = 200, headers: Headers | None = None) -> HttpReply:
    return HttpReply(status, [("Content-Type", JSON_CONTENT_TYPE), *(headers or ())], json_bytes(value))


def error_reply(error: BaseException) -> HttpReply:
    """``{"error": message}`` with the status from the one error table; 429 and 503 say
    when to retry. Anything that is not a domain error is a bug and is logged."""
    if not isinstance(error, ActorServeError):
        log.error("request failed", exc_info=error)
    status = http_status(error)
    retry_after = getattr(error, "retry_after", None) or RETRY_AFTER_SECONDS
    extra: Headers = [("Retry-After", str(retry_after))] if status in (429, 503) else []
    reason = getattr(error, "reason", None)  # SequenceNotHeld: a code a client or proxy can test
    more = {"reason": reason} if isinstance(reason, str) else {}
    return json_reply({"error": client_message(error), **more}, status, extra)


def too_large_reply(limit: int) -> HttpReply:
    return json_reply({"error": f"the request body is larger than {limit} bytes (max_body_bytes)"}, 413)


def no_route_reply(method: str, path: str) -> HttpReply:
    return json_reply({"error": f"no such endpoint: {method} {path}"}, 404)


def method_not_allowed_reply(method: str, path: str, allowed: Iterable[str]) -> HttpReply:
    return json_reply(
        {"error": f"method {method} is not allowed on {path}"}, 405, [("Allow", ", ".join(allowed))]
    )


# -- gzip ----------------------------------------------------------------------------------

#: Headers added to a gzipped reply.
GZIP_HEADERS: Final = (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding"))


def should_gzip(size: int, already_encoded: bool, accept_encoding: str | None, min_bytes: int) -> bool:
    """A complete body is gzipped when it is over ``min_bytes``, not already encoded, and
    the client accepts gzip (streams never are: each event must go out as produced)."""
    return size > min_bytes and not already_encoded and compression.accepts(accept_encoding)


def gzip(data: bytes) -> bytes:
    return compression.compress(data, "gzip")


# -- request bodies ----------------------------------------------------------------------


def decompress_body(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip or deflate); :class:`BodyTooLarge` past ``limit``."""
    try:
        name = compression.normalise(encoding)
    except compression.BadEncoding:
        raise BadInput(f"unsupported Content-Encoding {encoding!r} (use gzip or deflate)") from None
    if name is None:
        return body
    try:
        return compression.decompress(body, name, limit)
    except compression.TooLarge:
        raise BodyTooLarge from None
    except compression.BadEncoding as exc:
        if str(exc) == f"truncated {name} data":
            raise BadInput(f"the {name} request body is truncated") from None
        raise BadInput(f"the request body is {exc}") from None


def loads(body: bytes | memoryview, *, packed: bool = False) -> Any:
    """Parse JSON; :class:`BadInput` says what is wrong with it. ``packed``: an OIP
    request, whose inputs' large BYTES ``data`` arrays are parsed packed
    (:func:`~actorserve.jsonpacked.loads_packed`)."""
    if not len(body):
        raise BadInput("the request body is empty; expected a JSON object")
    check_json_containers(body)
    try:
        if packed:
            return loads_packed(body if isinstance(body, bytes) else bytes(body))
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"the request body is not valid JSON: {exc}") from None


def split_binary(body: bytes, headers: RequestHeaders) -> tuple[memoryview | bytes, memoryview | None]:
    """Split a body of Triton's binary tensor extension into (JSON header, binary data);
    the binary part is None when the request does not use the extension."""
    raw_length = headers.inference_header_length
    if raw_length is None:
        return body, None
    try:
        length = int(raw_length)
    except ValueError:
        raise BadInput(f"Inference-Header-Content-Length must be an integer, got {raw_length!r}") from None
    if not 0 <= length <= len(body):
        raise BadInput(f"Inference-Header-Content-Length {length} does not fit a body of {len(body)} bytes")
    view = memoryview(body)
    return view[:length], view[length:]


@attrs.frozen(slots=True)
class OutputEncoding:
    """Which outputs go back as binary tensors (Triton's ``binary_data_output`` for all,
    ``binary_data`` per requested output, which wins)."""

    binary_default: bool = False
    per_output: Mapping[str, bool] = attrs.field(factory=dict)

    def binary(self, name: str) -> bool:
        return self.per_output.get(name, self.binary_default)

    @property
    def any_binary(self) -> bool:
        return self.binary_default or any(self.per_output.values())


JSON_OUTPUTS: Final = OutputEncoding()


def decode_infer_request(
    body: bytes, headers: RequestHeaders, *, obj: Any = None
) -> tuple[InferenceRequest, OutputEncoding]:
    """An OIP request body (JSON, or JSON + binary tensors) as an engine request.

    Transport parameters are stripped; ``sequence-*`` headers become parameters. Pass
    ``obj`` when the JSON was already parsed (and the body had no binary part)."""
    binary: memoryview | None = None
    if obj is None:
        head, binary = split_binary(body, headers)
        obj = loads(head, packed=binary is None)
    request = _request_from_obj(obj, binary)
    encoding = _take_output_encoding(request)
    apply_sequence_headers(request, headers)
    return request, encoding


def _request_from_obj(obj: Any, binary: memoryview | None) -> InferenceRequest:
    inputs = obj.get("inputs") if isinstance(obj, dict) else None
    raw_positions: dict[int, Tensor] = {}
    budget = BytesElements()
    if isinstance(inputs, list):
        check_count(inputs, MAX_INPUTS, "inputs", "MAX_INPUTS")
        offset = 0
        for position, tensor_obj in enumerate(inputs):
            params = tensor_obj.get("parameters") if isinstance(tensor_obj, dict) else None
            if isinstance(params, dict) and "binary_data_size" in params:
                if binary is None:
                    raise BadInput(
                        f"input {tensor_obj.get('name')!r} has a binary_data_size, but the request has no "
                        "Inference-Header-Content-Length header giving the length of its JSON part"
                    )
                tensor, offset = _binary_input(tensor_obj, params, binary, offset, budget)
                raw_positions[position] = tensor
        if binary is not None and offset != len(binary):
            raise BadInput(
                f"{len(binary) - offset} bytes of binary data after the JSON header are not "
                "claimed by any input's binary_data_size"
            )
        if raw_positions:
            obj = {**obj, "inputs": [t for i, t in enumerate(inputs) if i not in raw_positions]}
    elif binary is not None and len(binary):
        raise BadInput("binary data after the JSON header, but the request has no inputs list")
    request = request_from_json(obj, budget)  # validates everything else with precise messages
    if raw_positions:
        decoded = iter(request.inputs)
        count = len(request.inputs) + len(raw_positions)
        request.inputs = [raw_positions[i] if i in raw_positions else next(decoded) for i in range(count)]
    return request


def _binary_input(
    obj: dict[str, Any], params: dict[str, Any], binary: memoryview, offset: int, budget: BytesElements
) -> tuple[Tensor, int]:
    name = obj.get("name")
    if not isinstance(name, str):
        raise BadInput(f"input without a string 'name': {str(obj)[:100]}")
    size = params["binary_data_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise BadInput(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
    for key in ("shape", "datatype"):
        if key not in obj:
            raise BadInput(f"input {name!r}: missing {key!r}")
    if "data" in obj:
        raise BadInput(f"input {name!r}: has both 'data' and binary_data_size")
    if offset + size > len(binary):
        raise BadInput(
            f"input {name!r}: binary_data_size {size} runs past the end of the binary data "
            f"({len(binary) - offset} bytes left)"
        )
    check_parameters(params, f"input {name!r}")
    rest = {k: v for k, v in params.items() if k not in TRANSPORT_PARAMETERS}
    tensor = tensor_from_raw(
        name, obj["datatype"], obj["shape"], binary[offset : offset + size], rest, budget
    )
    return tensor, offset + size


def _take_output_encoding(request: InferenceRequest) -> OutputEncoding:
    params = request.parameters
    default = False
    if params:
        for key in ("binary_data_size", "binary_data"):
            params.pop(key, None)
        if "binary_data_output" in params:
            default = bool_parameter(params.pop("binary_data_output"), "binary_data_output")
    per_output: dict[str, bool] = {}
    for wanted in request.outputs:
        if "binary_data" in wanted.parameters:
            per_output[wanted.name] = bool_parameter(wanted.parameters.pop("binary_data"), "binary_data")
    if not default and not per_output:
        return JSON_OUTPUTS
    return OutputEncoding(default, per_output)


def apply_sequence_headers(request: InferenceRequest, headers: RequestHeaders) -> None:
    """Copy ``sequence-*`` headers into the request parameters (a header that disagrees
    with a parameter of the body is an error; a ``sequence-id`` of ``0`` means none),
    then read the request's control record from them: every REST request the OIP door
    decodes comes through here, once."""
    for param, value in headers.sequence:
        value = value.strip()
        if param == "sequence_id" and no_sequence_text(value):
            continue
        if param == "sequence_id" and value == headers.naming.new_value:
            param, value = "sequence_start", "true"  # SageMaker's NEW_SESSION
        existing = request.parameters.get(param)
        if existing is None:
            request.parameters[param] = value
            continue
        if param == "sequence_id":
            same = str(existing) == value
        else:
            same = bool_parameter(existing, param) == bool_parameter(value, param)
        if not same:
            raise BadInput(
                f"header {param.replace('_', '-')!r} ({value!r}) disagrees with parameter "
                f"{param!r} ({existing!r})"
            )
    headers.naming.give_id(request)  # SageMaker's preset: its own id format for a start
    with_control(request)


# -- responses ---------------------------------------------------------------------------


def encode_infer_response(
    response: InferenceResponse, encoding: OutputEncoding = JSON_OUTPUTS, named: Headers | None = None
) -> HttpReply:
    """The 200 reply to an infer request: OIP JSON, or Triton's binary tensor layout
    (JSON header + raw output data) when the request asked for binary outputs. ``named``:
    the headers naming the sequence (None: :func:`sequence_header`)."""
    headers = sequence_header(response) if named is None else list(named)
    if not encoding.any_binary:
        headers.append(("Content-Type", JSON_CONTENT_TYPE))
        return HttpReply(200, headers, json_bytes(response_to_json(response)))
    doc = response_to_json(
        attrs.evolve(response, outputs=[t for t in response.outputs if not encoding.binary(t.name)])
    )
    outputs: list[dict[str, Any]] = []
    raws: list[bytes] = []
    json_outputs = iter(doc["outputs"])
    for tensor in response.outputs:
        if not encoding.binary(tensor.name):
            outputs.append(next(json_outputs))
            continue
        raw = tensor_to_raw(tensor)
        raws.append(raw)
        outputs.append(
            {
                "name": tensor.name,
                "shape": list(tensor.shape),
                "datatype": tensor.datatype,
                "parameters": {**tensor.parameters, "binary_data_size": len(raw)},
            }
        )
    doc["outputs"] = outputs
    head = json_bytes(doc)
    headers.append(("Content-Type", BINARY_CONTENT_TYPE))
    headers.append(("Inference-Header-Content-Length", str(len(head))))
    return HttpReply(200, headers, b"".join([head, *raws]))


def sequence_header(response: InferenceResponse | None) -> Headers:
    """``[("sequence-id", id)]`` when the response belongs to a sequence, else ``[]``."""
    if response is None:
        return []
    sequence_id = response.parameters.get("sequence_id")
    return [] if sequence_id is None else [("sequence-id", str(sequence_id))]


def encode_oip(response: InferenceResponse) -> bytes:
    """A response as OIP JSON (an ``infer_stream`` event)."""
    return json_bytes(response_to_json(response))
