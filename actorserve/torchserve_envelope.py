"""How a TorchServe request and response travel through the engine (no I/O).

TorchServe hands a handler, per request, a dict of named inputs (REST: ``body``; gRPC:
each key of the ``input`` map) with a content type, plus the request's headers; the
handler answers one body per request, with response headers and a status. Through our
engine that is an :class:`InferenceRequest` whose inputs are ``BYTES [1]`` tensors (the
raw bytes; ``content_type`` in the tensor's parameters) and whose parameter
:data:`HEADERS` holds the headers; the answer is an :class:`InferenceResponse` with one
``BYTES [1]`` output :data:`BODY`, the response headers in parameter :data:`HEADERS`
and the status in :data:`STATUS`. Both TorchServe's door (``transport/torchserve/``) and
the engine-side handler model (``torchserve/``) use this module, part of the engine API,
so they agree on it; they import nothing else of each other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import attrs
import numpy as np

from .types import InferenceRequest, InferenceResponse, Tensor

#: the REST body's input name (TorchServe's)
BODY: Final = "body"
#: request / response parameter: headers (name -> value; request names lowercased)
HEADERS: Final = "ts_headers"
#: response parameter: the HTTP status the handler set (default 200)
STATUS: Final = "ts_status"
#: response parameter: the status phrase / error message
MESSAGE: Final = "ts_message"
#: tensor parameter: the content type of an input or of the body
CONTENT_TYPE: Final = "content_type"
#: the response header a continuous-batching handler sets while its request streams on
STREAM_NEXT: Final = "ts_stream_next"
#: what a model with sequence batching shows as its platform (the transports read it to
#: start a sequence for a request that names none)
SEQUENCE_PLATFORM: Final = "torchserve/sequence"
PLATFORM: Final = "torchserve"


@attrs.frozen
class HeaderNames:
    """The stateful headers; overridable like TorchServe (``TS_REQUEST_SEQUENCE_ID`` /
    ``_START`` / ``_END`` environment variables, which its handlers' ``Context`` reads)."""

    sequence_id: str = "ts_request_sequence_id"
    sequence_start: str = "ts_request_sequence_start"
    sequence_end: str = "ts_request_sequence_end"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> HeaderNames:
        return cls(
            environ.get("TS_REQUEST_SEQUENCE_ID", "ts_request_sequence_id").lower(),
            environ.get("TS_REQUEST_SEQUENCE_START", "ts_request_sequence_start").lower(),
            environ.get("TS_REQUEST_SEQUENCE_END", "ts_request_sequence_end").lower(),
        )


def _bytes_tensor(name: str, value: bytes, content_type: str) -> Tensor:
    data = np.empty(1, dtype=object)
    data[0] = value
    params = {CONTENT_TYPE: content_type} if content_type else {}
    return Tensor(name, (1,), "BYTES", data, params)


def make_request(
    inputs: Mapping[str, tuple[bytes, str]],
    headers: Mapping[str, str],
    *,
    model: str,
    version: str | None = None,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> InferenceRequest:
    """A request of named raw inputs (name -> (bytes, content type)) and headers."""
    params: dict[str, Any] = dict(parameters or {})
    params[HEADERS] = {k.lower(): v for k, v in headers.items()}
    return InferenceRequest(
        inputs=[_bytes_tensor(name, value, ctype) for name, (value, ctype) in inputs.items()],
        id=request_id,
        parameters=params,
        model_name=model,
        model_version=version,
    )


def request_inputs(request: InferenceRequest) -> list[tuple[str, Any, str]]:
    """(name, raw value, content type) of every input; a non-BYTES tensor (a request
    from another front door) comes as its numpy array's list."""
    out = []
    for tensor in request.inputs:
        ctype = str(tensor.parameters.get(CONTENT_TYPE, ""))
        if tensor.datatype == "BYTES" and tensor.data.size == 1:
            value = tensor.data.reshape(-1)[0]
            out.append((tensor.name, value if isinstance(value, bytes) else str(value).encode(), ctype))
        else:
            out.append((tensor.name, tensor.data.tolist(), "application/json"))
    return out


def request_headers(request: InferenceRequest) -> dict[str, str]:
    raw = request.parameters.get(HEADERS)
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def make_response(
    request: InferenceRequest,
    model: str,
    version: str,
    body: bytes,
    *,
    content_type: str = "",
    headers: Mapping[str, str] | None = None,
    status: int = 200,
    message: str = "",
) -> InferenceResponse:
    params: dict[str, Any] = {HEADERS: dict(headers or {}), STATUS: status}
    if message:
        params[MESSAGE] = message
    return InferenceResponse(
        model_name=model,
        model_version=version,
        id=request.id,
        outputs=[_bytes_tensor(BODY, body, content_type)],
        parameters=params,
    )


@attrs.frozen
class Answer:
    """One response as a TorchServe client sees it."""

    body: bytes
    content_type: str
    headers: dict[str, str]
    status: int
    message: str


def answer(response: InferenceResponse) -> Answer:
    """Read a response of the handler model; any other model's response becomes JSON
    (output name -> its values)."""
    params = response.parameters
    raw_headers = params.get(HEADERS)
    headers = {str(k): str(v) for k, v in raw_headers.items()} if isinstance(raw_headers, Mapping) else {}
    status = params.get(STATUS, 200)
    status = status if isinstance(status, int) and not isinstance(status, bool) else 200
    message = str(params.get(MESSAGE, ""))
    for tensor in response.outputs:
        if tensor.name == BODY and tensor.datatype == "BYTES" and tensor.data.size == 1:
            value = tensor.data.reshape(-1)[0]
            body = value if isinstance(value, bytes) else str(value).encode()
            return Answer(body, str(tensor.parameters.get(CONTENT_TYPE, "")), headers, status, message)
    import json

    values = {t.name: _plain(t.data) for t in response.outputs}
    return Answer(json.dumps(values, indent=2).encode(), "application/json", headers, status, message)


def _plain(data: np.ndarray[Any, Any]) -> Any:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in data.reshape(-1).tolist()]


def ok_status(status: int) -> bool:
    return 200 <= status < 300
