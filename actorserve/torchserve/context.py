"""The ``context`` a TorchServe handler gets: the same attributes and methods as
``ts.context.Context`` (a handler cannot tell them apart), backed by our engine.

Intermediate responses: ``ts``'s ``send_intermediate_predict_response`` encodes them in
TorchServe's backend frame and writes it to ``context.cl_socket``; here that socket is
an :class:`IntermediateSink`, which decodes the frame and hands the responses to the
running step (:mod:`.handler_model`). Our own :func:`send_intermediate_predict_response`
does the same without the ``ts`` package.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import attrs

from ..torchserve_envelope import HeaderNames


class RequestProcessor:
    """One request's headers in, response headers and status out (``ts``'s class)."""

    def __init__(self, request_header: dict[str, Any]) -> None:
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}
        self._request_header = request_header

    def get_request_property(self, key: str) -> Any:
        return self._request_header.get(key)

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)

    def get_request_properties(self) -> dict[str, Any]:
        return self._request_header


class Metrics:
    """Accepts ``ts``'s metric calls (``add_time``, ``add_counter``, ...) and drops them:
    actorserve's own ``/metrics`` counts requests and steps."""

    request_ids: Any = None

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("add_") or name in ("emit_metrics", "set_request_ids"):
            return _ignore
        raise AttributeError(name)


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


@attrs.frozen
class Intermediate:
    """One decoded intermediate frame: per request id, (body, content type, status,
    phrase, headers)."""

    code: int
    message: str
    responses: dict[str, tuple[bytes, str, int, str, dict[str, str]]]


def decode_predict_frame(frame: bytes) -> Intermediate:
    """TorchServe's backend predict response (``create_predict_response``)."""
    view = memoryview(frame)
    pos = 0

    def integer() -> int:
        nonlocal pos
        (value,) = struct.unpack_from("!i", view, pos)
        pos += 4
        return int(value)

    def blob() -> bytes:
        nonlocal pos
        size = integer()
        data = bytes(view[pos : pos + size])
        pos += size
        return data

    code = integer()
    message = blob().decode("utf-8", "replace")
    responses: dict[str, tuple[bytes, str, int, str, dict[str, str]]] = {}
    while True:
        size = integer()
        if size == -1:
            break
        request_id = bytes(view[pos : pos + size]).decode()
        pos += size
        content_type = blob().decode()
        status = integer()
        phrase = blob().decode()
        headers = {}
        for _ in range(integer()):
            key = blob().decode()
            headers[key] = blob().decode()
        responses[request_id] = (blob(), content_type, status, phrase, headers)
    return Intermediate(code, message, responses)


class IntermediateSink:
    """``context.cl_socket``: takes the frames ``send_intermediate_predict_response``
    writes and passes them, decoded, to ``deliver`` (which blocks while the step that
    reads them is behind: the handler waits, as on TorchServe's socket)."""

    def __init__(self, deliver: Callable[[Intermediate], None]) -> None:
        self._deliver = deliver

    def sendall(self, data: bytes) -> None:
        self._deliver(decode_predict_frame(bytes(data)))


class Context:
    """What ``ts.context.Context`` offers a handler."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any],
        batch_size: int,
        model_yaml_config: dict[str, Any],
        headers: HeaderNames,
        sink: IntermediateSink,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties = {
            "model_dir": model_dir,
            "gpu_id": None,
            "batch_size": batch_size,
            "server_name": "actorserve",
            "server_version": _version(),
            "limit_max_image_pixels": True,
        }
        self.request_ids: dict[int, str] | None = None
        self._request_processor: list[RequestProcessor] = []
        self.metrics = Metrics()
        self.model_yaml_config = model_yaml_config
        self.stopping_criteria: list[Callable[[Any], bool | None]] | None = None
        self.header_key_sequence_id = headers.sequence_id
        self.header_key_sequence_start = headers.sequence_start
        self.header_key_sequence_end = headers.sequence_end
        self.cl_socket = sink
        #: free for the handler (TorchServe's stateful example keeps its requests here)
        self.cache: Any = None

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    @property
    def request_processor(self) -> list[RequestProcessor]:
        return self._request_processor

    @request_processor.setter
    def request_processor(self, value: list[RequestProcessor]) -> None:
        self._request_processor = value

    def get_request_id(self, idx: int = 0) -> str | None:
        return None if self.request_ids is None else self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self._request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self._request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self._request_processor[idx]
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if self._request_processor and self._request_processor[idx] is not None:
            self._request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self._request_processor:
            processor.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self._request_processor[idx].get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._request_processor[idx].add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> Any:
        return self._request_processor[idx].get_request_property(self.header_key_sequence_id)


def encode_body(value: Any) -> bytes:
    """A handler's answer for one request as TorchServe sends it: bytes as they are,
    text as UTF-8, a tensor ``torch.save``d, anything else as indented JSON
    (:class:`TypeError` when it is not JSON)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if type(value).__name__ == "Tensor" and type(value).__module__.startswith("torch"):
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    return json.dumps(value, indent=2).encode("utf-8")


def encode_predict_frame(
    ret: list[Any], request_ids: dict[int, str], message: str, code: int, context: Context
) -> bytes:
    """The frame ``ts``'s ``create_predict_response(..., ts_stream_next=True)`` writes."""
    frame = bytearray(struct.pack("!i", code))
    encoded = message.encode()
    frame += struct.pack("!i", len(encoded)) + encoded
    for idx, request_id in request_ids.items():
        context.set_response_header(idx, "ts_stream_next", "true")
        for part in (request_id, context.get_response_content_type(idx) or ""):
            data = part.encode()
            frame += struct.pack("!i", len(data)) + data
        status, phrase = context.get_response_status(idx)
        frame += struct.pack("!i", status)
        data = (phrase or "").encode()
        frame += struct.pack("!i", len(data)) + data
        headers = context.get_response_headers(idx)
        frame += struct.pack("!i", len(headers))
        for key, value in headers.items():
            for part in (key, value):
                data = part.encode()
                frame += struct.pack("!i", len(data)) + data
        body = encode_body(ret[idx])
        frame += struct.pack("!i", len(body)) + body
    frame += struct.pack("!i", -1)
    return bytes(frame)


def send_intermediate_predict_response(
    ret: list[Any], req_id_map: dict[int, str], message: str, code: int, context: Context
) -> None:
    """``ts.handler_utils.utils.send_intermediate_predict_response``, for handlers
    that do not have the ``ts`` package."""
    context.cl_socket.sendall(encode_predict_frame(ret, req_id_map, message, code, context))


def _version() -> str:
    from ..version import __version__

    return __version__
