"""The REST transport: Open Inference Protocol (KServe V2) over HTTP, on quart-trio.

Transport code only parses, calls the :class:`~actorserve.engine.Engine` and encodes. The
module has three layers:

- pure functions (no I/O) that decode request bodies (OIP JSON, Triton's binary tensor
  extension, Triton's generate extension, ``EventSource`` query strings), encode
  responses, and map errors through the one table in :mod:`actorserve.transport.errors`;
- :class:`RestAPI`, the Quart views for every endpoint (see ``docs/rest.md``);
- :class:`RestApp`, the ASGI application handed to hypercorn: a thin raw-ASGI fast path
  for ``POST /v2/models/{name}[/versions/{v}]/infer`` (the hot path, where Quart's
  per-request machinery costs 30-45% of the throughput) that uses the same functions
  as the Quart view, and Quart for everything else.

Every error a client sees is ``{"error": "<message>"}`` JSON with a meaningful status,
including unknown routes (404), wrong methods (405) and oversized bodies (413).
"""

from __future__ import annotations

import logging
import math
import re
import zlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import numpy as np
import orjson
import trio
from quart import Response, request
from quart.wrappers.response import DataBody
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers as WerkzeugHeaders
from werkzeug.exceptions import HTTPException

from .. import __version__
from ..codecs import request_from_json, response_to_json, tensor_from_list, tensor_from_raw, tensor_to_raw
from ..engine import Engine
from ..errors import ActorServeError, BadInput, ModelNotFound, ModelNotReady
from ..model import bool_parameter
from ..settings import ModelSettings, Settings, SettingsError
from ..types import InferenceRequest, InferenceResponse, Tensor
from . import sse
from .errors import RETRY_AFTER_SECONDS, client_message, http_status
from .playground import register_playground

log = logging.getLogger(__name__)

#: What ``GET /v2`` reports: the protocol extensions this server really implements.
EXTENSIONS: Final = (
    "binary_tensor_data",
    "generate",
    "model_repository",
    "parameters",
    "sequence",
    "streaming",
)

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
_GZIP_LEVEL: Final = 6

JSON_CONTENT_TYPE: Final = "application/json"
BINARY_CONTENT_TYPE: Final = "application/octet-stream"

Headers = list[tuple[str, str]]

# -- request headers ---------------------------------------------------------------------


@attrs.frozen(slots=True)
class RequestHeaders:
    """The request headers the transport acts on (both front doors build one)."""

    content_length: str | None = None
    content_encoding: str | None = None
    accept_encoding: str | None = None
    inference_header_length: str | None = None
    #: (request parameter, header value) for each ``sequence-*`` header sent.
    sequence: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_asgi(cls, raw: Iterable[tuple[bytes, bytes]]) -> RequestHeaders:
        """From an ASGI scope's header list (names are lower-case there)."""
        values: dict[str, str] = {}
        for name, value in raw:
            key = name.decode("latin-1")
            if key in _WANTED_HEADERS:
                values[key] = value.decode("latin-1")
        return cls._from_values(values)

    @classmethod
    def from_lookup(cls, get: Callable[[str], str | None]) -> RequestHeaders:
        """From a case-insensitive lookup such as Quart's ``request.headers.get``."""
        values = {key: value for key in _WANTED_HEADERS if (value := get(key)) is not None}
        return cls._from_values(values)

    @classmethod
    def _from_values(cls, values: dict[str, str]) -> RequestHeaders:
        if not values:
            return _NO_HEADERS
        return cls(
            content_length=values.get("content-length"),
            content_encoding=values.get("content-encoding"),
            accept_encoding=values.get("accept-encoding"),
            inference_header_length=values.get("inference-header-content-length"),
            sequence=tuple(
                (param, values[header]) for header, param in SEQUENCE_HEADERS.items() if header in values
            ),
        )


_WANTED_HEADERS: Final = frozenset(
    {"content-length", "content-encoding", "accept-encoding", "inference-header-content-length", *SEQUENCE_HEADERS}
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
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def json_reply(value: Any, status: int = 200, headers: Headers | None = None) -> HttpReply:
    return HttpReply(status, [("Content-Type", JSON_CONTENT_TYPE), *(headers or ())], json_bytes(value))


def error_reply(error: BaseException) -> HttpReply:
    """``{"error": message}`` with the status from the one error table; 429 and 503 say
    when to retry. Anything that is not a domain error is a bug and is logged."""
    if not isinstance(error, ActorServeError):
        log.error("request failed", exc_info=error)
    status = http_status(error)
    extra: Headers = [("Retry-After", str(RETRY_AFTER_SECONDS))] if status in (429, 503) else []
    return json_reply({"error": client_message(error)}, status, extra)


def too_large_reply(limit: int) -> HttpReply:
    return json_reply({"error": f"the request body is larger than {limit} bytes (max_body_bytes)"}, 413)


def http_error_reply(error: HTTPException, max_body_bytes: int) -> HttpReply:
    """A werkzeug/Quart HTTP error (404 route, 405, 413, 408...) as JSON."""
    status = error.code or 500
    if status == 413:
        return too_large_reply(max_body_bytes)
    if status == 404:
        message = f"no such endpoint: {request.method} {request.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.path}"
    else:
        message = error.description or error.name
    headers = [(k, v) for k, v in error.get_headers() if k.lower() == "allow"]
    return json_reply({"error": message}, status, headers)


# -- request bodies ----------------------------------------------------------------------


def decompress_body(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip or deflate), refusing to inflate past ``limit``."""
    if not encoding or encoding.strip().lower() == "identity":
        return body
    name = encoding.strip().lower()
    if name in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif name == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise BadInput(f"unsupported Content-Encoding {encoding!r} (use gzip or deflate)")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadInput(f"the request body is not valid {name} data: {exc}") from None
    if len(out) > limit:
        raise _TooLarge
    if not inflater.eof:
        raise BadInput(f"the {name} request body is truncated")
    return out


class _TooLarge(Exception):
    """The (decompressed) body is over ``max_body_bytes``."""


def loads(body: bytes | memoryview) -> Any:
    """Parse JSON; :class:`BadInput` says what is wrong with it."""
    if not len(body):
        raise BadInput("the request body is empty; expected a JSON object")
    try:
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
        raise BadInput(
            f"Inference-Header-Content-Length {length} does not fit a body of {len(body)} bytes"
        )
    view = memoryview(body)
    return view[:length], view[length:]


def decode_infer_request(
    body: bytes, headers: RequestHeaders, *, obj: Any = None
) -> tuple[InferenceRequest, OutputEncoding]:
    """An OIP request body (JSON, or JSON + binary tensors) as an engine request.

    Transport parameters are stripped; ``sequence-*`` headers become parameters. Pass
    ``obj`` when the JSON was already parsed (and the body had no binary part)."""
    binary: memoryview | None = None
    if obj is None:
        head, binary = split_binary(body, headers)
        obj = loads(head)
    request = _request_from_obj(obj, binary)
    encoding = _take_output_encoding(request)
    apply_sequence_headers(request, headers)
    return request, encoding


def _request_from_obj(obj: Any, binary: memoryview | None) -> InferenceRequest:
    inputs = obj.get("inputs") if isinstance(obj, dict) else None
    raw_positions: dict[int, Tensor] = {}
    if isinstance(inputs, list):
        offset = 0
        for position, tensor_obj in enumerate(inputs):
            params = tensor_obj.get("parameters") if isinstance(tensor_obj, dict) else None
            if isinstance(params, dict) and "binary_data_size" in params:
                if binary is None:
                    raise BadInput(
                        f"input {tensor_obj.get('name')!r} has a binary_data_size, but the request has no "
                        "Inference-Header-Content-Length header giving the length of its JSON part"
                    )
                tensor, offset = _binary_input(tensor_obj, params, binary, offset)
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
    request = request_from_json(obj)  # validates everything else with precise messages
    if raw_positions:
        decoded = iter(request.inputs)
        count = len(request.inputs) + len(raw_positions)
        request.inputs = [raw_positions[i] if i in raw_positions else next(decoded) for i in range(count)]
    return request


def _binary_input(obj: dict[str, Any], params: dict[str, Any], binary: memoryview, offset: int) -> tuple[Tensor, int]:
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
    rest = {k: v for k, v in params.items() if k not in TRANSPORT_PARAMETERS}
    tensor = tensor_from_raw(name, obj["datatype"], obj["shape"], binary[offset : offset + size], rest)
    return tensor, offset + size


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


_JSON_OUTPUTS: Final = OutputEncoding()


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
        return _JSON_OUTPUTS
    return OutputEncoding(default, per_output)


def apply_sequence_headers(request: InferenceRequest, headers: RequestHeaders) -> None:
    """Copy ``sequence-*`` headers into the request parameters (a header that disagrees
    with a parameter of the body is an error). A ``sequence-id`` of ``0`` means none."""
    for param, value in headers.sequence:
        value = value.strip()
        if param == "sequence_id" and value in ("", "0"):
            continue
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


# -- responses ---------------------------------------------------------------------------


def encode_infer_response(response: InferenceResponse, encoding: OutputEncoding = _JSON_OUTPUTS) -> tuple[bytes, Headers]:
    """The body and headers of an infer response: OIP JSON, or Triton's binary tensor
    layout (JSON header + raw output data) when the request asked for binary outputs."""
    headers: Headers = []
    sequence_id = response.parameters.get("sequence_id")
    if sequence_id is not None:
        headers.append(("sequence-id", str(sequence_id)))
    if not encoding.any_binary:
        headers.append(("Content-Type", JSON_CONTENT_TYPE))
        return json_bytes(response_to_json(response)), headers
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
    return b"".join([head, *raws]), headers


def sequence_header(response: InferenceResponse | None) -> Headers:
    if response is None:
        return []
    sequence_id = response.parameters.get("sequence_id")
    return [] if sequence_id is None else [("sequence-id", str(sequence_id))]


# -- Triton's generate extension ---------------------------------------------------------

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


def generate_tensor(name: str, value: object, datatypes: Mapping[str, str]) -> Tensor:
    """A top-level value of a generate request as a tensor: a scalar is shape [1], a
    (nested) list keeps its shape; the datatype comes from the model's metadata, else
    from the values (str: BYTES, bool: BOOL, int: INT64, float: FP64)."""
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
    return tensor_from_list(name, datatype, shape, data)


def generate_request_from_json(obj: dict[str, Any], datatypes: Mapping[str, str]) -> InferenceRequest:
    """Triton's generate request ``{"id"?, "text_input": ..., "parameters"?: {...}, ...}``:
    every top-level key but ``id`` and ``parameters`` becomes an input tensor."""
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInput("'id' must be a string")
    parameters = obj.get("parameters")
    if parameters is None:
        parameters = {}
    elif not isinstance(parameters, dict):
        raise BadInput("'parameters' must be a JSON object")
    inputs = [generate_tensor(k, v, datatypes) for k, v in obj.items() if k not in _GENERATE_RESERVED]
    return InferenceRequest(inputs=inputs, id=request_id, parameters=parameters)


_INT = re.compile(r"[+-]?\d+")


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


def generate_request_from_query(args: Iterable[tuple[str, list[str]]], datatypes: Mapping[str, str]) -> InferenceRequest:
    """``GET .../generate_stream?text_input=...&n_tokens=3``: ``text_input`` and the
    model's declared inputs become tensors (text stays text for BYTES inputs, other values
    are parsed as for parameters), ``id`` is the request id, any other key a parameter."""
    inputs: list[Tensor] = []
    parameters: dict[str, Any] = {}
    request_id: str | None = None
    for key, raw_values in args:
        if key == "id":
            request_id = raw_values[-1]
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
        scalar = tensor.data.size == 1 and len(tensor.shape) <= 1
        if tensor.datatype == "BYTES":
            texts = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in tensor.data.reshape(-1)]
            if scalar:
                out[tensor.name] = texts[0]
            else:
                array = np.empty(len(texts), dtype=object)
                array[:] = texts
                out[tensor.name] = array.reshape(tensor.shape).tolist()
        else:
            out[tensor.name] = tensor.data.reshape(-1)[0].item() if scalar else tensor.data.tolist()
    return out


# -- compression -------------------------------------------------------------------------


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header allows gzip (``gzip;q=0`` does not)."""
    if not accept_encoding:
        return False
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() not in ("gzip", "x-gzip", "*"):
            continue
        q = params.strip()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def _gzip(data: bytes) -> bytes:
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


async def gzip_body(data: bytes) -> bytes:
    """gzip ``data``; large bodies are compressed in a worker thread."""
    if len(data) >= GZIP_IN_THREAD_BYTES:
        return await trio.to_thread.run_sync(_gzip, data)
    return _gzip(data)


async def compress_reply(reply: HttpReply, accept_encoding: str | None, min_bytes: int) -> HttpReply:
    """gzip a complete reply when the client accepts it and it is over ``min_bytes``."""
    if len(reply.body) <= min_bytes or not accepts_gzip(accept_encoding):
        return reply
    body = await gzip_body(reply.body)
    return HttpReply(reply.status, [*reply.headers, ("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")], body)


# -- the operations shared by both front doors -------------------------------------------

FindModels = Callable[[str], list[ModelSettings]]


class RestAPI:
    """The REST endpoints over one engine. Views raise domain errors; the error handlers
    registered by :func:`create_app` turn them into JSON with the table's status."""

    def __init__(self, engine: Engine, settings: Settings, find_models: FindModels | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.find_models = find_models

    # -- unary infer (used by the Quart view and the fast path) --------------------------

    async def infer_reply(self, name: str, version: str | None, body: bytes, headers: RequestHeaders) -> HttpReply:
        """Decode, infer, encode; every failure is an error reply, never an exception."""
        try:
            body = decompress_body(body, headers.content_encoding, self.settings.max_body_bytes)
            infer_request, encoding = decode_infer_request(body, headers)
            response = await self.engine.infer(infer_request, model=name, version=version)
            data, reply_headers = encode_infer_response(response, encoding)
            return HttpReply(200, reply_headers, data)
        except _TooLarge:
            return too_large_reply(self.settings.max_body_bytes)
        except Exception as exc:
            return error_reply(exc)

    # -- Quart views ---------------------------------------------------------------------

    async def _body(self) -> bytes:
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        try:
            return decompress_body(body, request.headers.get("Content-Encoding"), self.settings.max_body_bytes)
        except _TooLarge:
            raise _BodyTooLarge from None

    async def live(self) -> Response:
        return _response(json_reply({"live": True}))

    async def ready(self) -> Response:
        if self.engine.is_ready:
            return _response(json_reply({"ready": True}))
        not_ready = [f"{h.name}:{h.version}" for h in self.engine.hosts() if not h.ready]
        why = "the server is shutting down" if not not_ready else f"not ready: {', '.join(not_ready)}"
        return _response(error_reply(ModelNotReady(why)))

    async def server_metadata(self) -> Response:
        return _response(json_reply({"name": "actorserve", "version": __version__, "extensions": list(EXTENSIONS)}))

    async def model_metadata(self, name: str, version: str | None = None) -> Response:
        return _response(json_reply(self.engine.metadata_dict(name, version)))

    async def model_ready(self, name: str, version: str | None = None) -> Response:
        host = self.engine.host(name, version)
        if not host.ready:
            raise ModelNotReady(f"model {name!r} version {host.version!r} is not ready ({host.state.lower()})")
        return _response(json_reply({"name": host.name, "version": host.version, "ready": True}))

    async def repository_index(self) -> Response:
        ready_only = False
        if request.method == "POST":
            body = await self._body()
            if body.strip():
                obj = loads(body)
                if not isinstance(obj, dict):
                    raise BadInput("the repository index request must be a JSON object")
                ready_only = bool_parameter(obj.get("ready", False), "ready")
        index = self.engine.repository_index_dicts()
        if ready_only:
            index = [entry for entry in index if entry["state"] == "READY"]
        return _response(json_reply(index))

    async def load(self, name: str) -> Response:
        await self._body()  # Triton's load parameters (config overrides) are not supported
        if self.find_models is None:
            versions = [m for m in self.settings.models if m.name == name]
            if not versions:
                raise ModelNotFound(f"model {name!r} is not in the model repository")
        else:
            versions = self.find_models(name)
        for model_settings in versions:
            try:
                await self.engine.load(model_settings)
            except SettingsError as exc:  # e.g. an implementation that cannot be imported
                raise BadInput(str(exc)) from None
        return _response(json_reply({}))

    async def unload(self, name: str) -> Response:
        await self._body()
        await self.engine.unload(name, grace=self.settings.grace_period)
        return _response(json_reply({}))

    async def infer(self, name: str, version: str | None = None) -> Response:
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        headers = RequestHeaders.from_lookup(request.headers.get)
        return _response(await self.infer_reply(name, version, body, headers))

    async def infer_stream(self, name: str, version: str | None = None) -> Response:
        body = await self._body()
        infer_request, _ = decode_infer_request(body, RequestHeaders.from_lookup(request.headers.get))
        return await self._stream(infer_request, name, version, _encode_oip)

    async def generate(self, name: str, version: str | None = None) -> Response:
        infer_request, encode = await self._generate_request(name, version)
        response = await self.engine.infer(infer_request, model=name, version=version)
        return _response(HttpReply(200, [("Content-Type", JSON_CONTENT_TYPE), *sequence_header(response)], encode(response)))

    async def generate_stream(self, name: str, version: str | None = None) -> Response:
        if request.method == "GET":
            datatypes = (await self.engine.metadata(name, version)).input_datatypes()
            query = ((key, request.args.getlist(key)) for key in request.args)
            infer_request = generate_request_from_query(query, datatypes)
            apply_sequence_headers(infer_request, RequestHeaders.from_lookup(request.headers.get))
            return await self._stream(infer_request, name, version, _encode_event_source, end_event=True)
        infer_request, encode = await self._generate_request(name, version)
        return await self._stream(infer_request, name, version, encode)

    async def _generate_request(
        self, name: str, version: str | None
    ) -> tuple[InferenceRequest, Callable[[InferenceResponse], bytes]]:
        """Either shape of a generate body: OIP tensors (answered as OIP, like infer) or
        Triton's ``text_input`` shape (answered with ``text_output``)."""
        body = await self._body()
        headers = RequestHeaders.from_lookup(request.headers.get)
        if headers.inference_header_length is not None:
            return decode_infer_request(body, headers)[0], _encode_oip
        obj = loads(body)
        if not isinstance(obj, dict) or "inputs" in obj:
            return decode_infer_request(body, headers, obj=obj)[0], _encode_oip
        datatypes = (await self.engine.metadata(name, version)).input_datatypes()
        infer_request = generate_request_from_json(obj, datatypes)
        apply_sequence_headers(infer_request, headers)
        return infer_request, _encode_generate

    async def _stream(
        self,
        infer_request: InferenceRequest,
        name: str,
        version: str | None,
        encode: Callable[[InferenceResponse], bytes],
        *,
        end_event: bool = False,
    ) -> Response:
        """An SSE response. The first response is pulled before the response starts, so
        an error known by then gets its status; later errors become ``event: error``."""
        responses = _responses(self.engine, infer_request, name, version)
        try:
            first: InferenceResponse | None = await responses.__anext__()
        except StopAsyncIteration:
            first = None
        frames = sse.event_frames(first, responses, encode, end_event=end_event)
        headers = WerkzeugHeaders([*sse.EVENT_STREAM_HEADERS, *sequence_header(first)])
        response = Response(frames, status=200, headers=headers)
        response.timeout = None  # Quart's default response timeout (60 s) would cut the stream
        return response


async def _responses(
    engine: Engine, infer_request: InferenceRequest, name: str, version: str | None
) -> AsyncGenerator[InferenceResponse, None]:
    """The engine's responses to one request. Closing this generator (or cancelling its
    reader) leaves the engine's stream context, which cancels the request there."""
    async with engine.infer_stream(infer_request, model=name, version=version) as stream:
        async for response in stream:
            yield response


def _encode_oip(response: InferenceResponse) -> bytes:
    return json_bytes(response_to_json(response))


def _encode_generate(response: InferenceResponse) -> bytes:
    return json_bytes(generate_response_to_json(response))


def _encode_event_source(response: InferenceResponse) -> bytes:
    """A GET stream's event names its sequence too: ``EventSource`` cannot read headers."""
    doc = generate_response_to_json(response)
    if "sequence_id" in response.parameters:
        doc["sequence_id"] = response.parameters["sequence_id"]
    return json_bytes(doc)


class _BodyTooLarge(Exception):
    """A decompressed body over max_body_bytes, raised inside a Quart view."""


def _response(reply: HttpReply) -> Response:
    return Response(reply.body, status=reply.status, headers=WerkzeugHeaders(reply.headers))


# -- the ASGI application ----------------------------------------------------------------

_INFER_PATH: Final = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")

# Raw ASGI messages are handled as plain dicts on the fast path; hypercorn's TypedDicts
# only matter at the boundary, where these aliases are cast.
ASGIScope = Mapping[str, Any]
ASGIReceive = Callable[[], Awaitable[Any]]
ASGISend = Callable[[Any], Awaitable[None]]


class RestApp:
    """The ASGI application: ``POST .../infer`` on a raw-ASGI fast path (when
    ``fast_path``), every other request through the Quart app.

    The fast path answers exactly as the Quart view does (same decode/encode/error
    functions, same gzip rule, same 413 rule) and cancels the request in the engine when
    the client disconnects before the answer is sent."""

    def __init__(self, api: RestAPI, quart: QuartTrio, *, fast_path: bool = True) -> None:
        self.api = api
        self.quart = quart
        self.fast_path = fast_path
        self._limit = api.settings.max_body_bytes
        self._gzip_min = api.settings.gzip_min_bytes

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        if self.fast_path and scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                await self._infer(scope, receive, send, match[1], match[2])
                return
        await self.quart(scope, receive, send)  # type: ignore[arg-type]

    async def _infer(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, name: str, version: str | None) -> None:
        headers = RequestHeaders.from_asgi(scope["headers"])
        body = await self._read_body(headers, receive)
        if body is None:  # the client went away
            return
        if isinstance(body, HttpReply):
            await _send_reply(send, body)
            return
        reply: HttpReply | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            reply = await self.api.infer_reply(name, version, body, headers)
            nursery.cancel_scope.cancel()
        if reply is None:
            return
        reply = await compress_reply(reply, headers.accept_encoding, self._gzip_min)
        await _send_reply(send, reply)

    async def _read_body(self, headers: RequestHeaders, receive: ASGIReceive) -> bytes | HttpReply | None:
        """The whole body; a 413 reply as soon as it is known to be over the limit
        (from Content-Length, before reading); None if the client disconnected."""
        limit = self._limit
        if headers.content_length is not None:
            try:
                declared = int(headers.content_length)
            except ValueError:
                return json_reply({"error": "invalid Content-Length"}, 400)
            if declared > limit:
                return too_large_reply(limit)
        message = await receive()
        if message["type"] != "http.request":
            return None
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            return too_large_reply(limit) if len(body) > limit else body
        chunks = [body]
        size = len(body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return too_large_reply(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _cancel_on_disconnect(receive: ASGIReceive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _send_reply(send: ASGISend, reply: HttpReply) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers]
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


# -- assembling the app ------------------------------------------------------------------

_MODEL_SUFFIXES: Final = (
    ("", "model_metadata", ("GET",)),
    ("/ready", "model_ready", ("GET",)),
    ("/infer", "infer", ("POST",)),
    ("/infer_stream", "infer_stream", ("POST",)),
    ("/generate", "generate", ("POST",)),
    ("/generate_stream", "generate_stream", ("GET", "POST")),
)


def create_app(
    engine: Engine,
    settings: Settings,
    *,
    find_models: FindModels | None = None,
    fast_path: bool = True,
) -> RestApp:
    """The ASGI application serving ``engine``. ``find_models(name)`` returns the
    settings of every version of a model for ``POST /v2/repository/models/{name}/load``
    (raising :class:`ModelNotFound`); without it only ``settings.models`` can be loaded.
    ``fast_path=False`` sends infer through Quart too (for comparison)."""
    api = RestAPI(engine, settings, find_models)
    app = QuartTrio("actorserve")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    def route(rule: str, endpoint: str, methods: tuple[str, ...]) -> None:
        app.add_url_rule(rule, endpoint, getattr(api, endpoint), methods=list(methods))

    route("/v2/health/live", "live", ("GET",))
    route("/v2/health/ready", "ready", ("GET",))
    route("/v2", "server_metadata", ("GET",))
    app.add_url_rule("/v2/", "server_metadata_slash", api.server_metadata, methods=["GET"])
    route("/v2/repository/index", "repository_index", ("GET", "POST"))
    route("/v2/repository/models/<name>/load", "load", ("POST",))
    route("/v2/repository/models/<name>/unload", "unload", ("POST",))
    for suffix, endpoint, methods in _MODEL_SUFFIXES:
        route(f"/v2/models/<name>{suffix}", endpoint, methods)
        app.add_url_rule(
            f"/v2/models/<name>/versions/<version>{suffix}",
            f"{endpoint}_version",
            getattr(api, endpoint),
            methods=list(methods),
        )

    async def on_error(error: Exception) -> Response:
        if isinstance(error, HTTPException):
            return _response(http_error_reply(error, settings.max_body_bytes))
        if isinstance(error, _BodyTooLarge):
            return _response(too_large_reply(settings.max_body_bytes))
        return _response(error_reply(error))

    app.register_error_handler(Exception, on_error)

    async def compress(response: Response) -> Response:
        body = response.response
        if (
            isinstance(body, DataBody)
            and len(body.data) > settings.gzip_min_bytes
            and "Content-Encoding" not in response.headers
            and accepts_gzip(request.headers.get("Accept-Encoding"))
        ):
            response.set_data(await gzip_body(body.data))
            response.headers["Content-Encoding"] = "gzip"
            response.headers["Vary"] = "Accept-Encoding"
        return response

    app.after_request(compress)
    register_playground(app)
    return RestApp(api, app, fast_path=fast_path)
