"""A prediction's body as TorchServe's frontend splits it into the handler's inputs (no I/O).

``multipart/form-data``: one input per part (a file keeps its content type, a field has
none); ``application/x-www-form-urlencoded``: one input per field; anything else: the
whole body as input ``body`` with the request's mime type (without parameters, as
Netty's ``getMimeType``).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from ...errors import BadInput
from ...limits import MAX_FORM_FIELDS
from ...torchserve_envelope import BODY


def split_body(body: bytes, content_type: str, limit: int) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type); :class:`BadInput` for a malformed form."""
    mime, options = parse_options_header(content_type)
    mime = mime.lower()
    if mime == "application/x-www-form-urlencoded":
        _check_fields(body.count(b"&") + 1)
        fields = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {name: (value.encode(), "") for name, value in fields}
    if mime == "multipart/form-data":
        boundary = options.get("boundary")
        if not boundary:
            raise BadInput("multipart/form-data without a boundary")
        delimiter = b"--" + boundary.encode("latin-1")
        _check_fields(body.count(delimiter) - 1)
        return _multipart(body, delimiter[2:], limit)
    return {BODY: (body, mime)}


def _check_fields(count: int) -> None:
    """Each field becomes one input of the handler: refuse a form with too many before
    any is parsed (``count`` is an upper bound counted in C: separators or delimiters)."""
    if count > MAX_FORM_FIELDS:
        raise BadInput(
            f"the form has more than {MAX_FORM_FIELDS} fields "
            "(limit MAX_FORM_FIELDS; see docs/security.md#limits)"
        )


def _multipart(body: bytes, boundary: bytes, limit: int) -> dict[str, tuple[bytes, str]]:
    decoder = MultipartDecoder(boundary, max_form_memory_size=limit)
    decoder.receive_data(body)
    decoder.receive_data(None)
    parts: dict[str, tuple[bytes, str]] = {}
    name, content_type, chunks = "", "", bytearray()
    try:
        while True:
            event = decoder.next_event()
            if isinstance(event, (Field, File)):
                name = event.name
                content_type = event.headers.get("content-type", "") if isinstance(event, File) else ""
                chunks = bytearray()
            elif isinstance(event, Data):
                chunks += event.data
                if not event.more_data:
                    parts[name] = (bytes(chunks), content_type)
            elif isinstance(event, (Epilogue, NeedData)):
                break
    except ValueError as exc:
        raise BadInput(f"malformed multipart/form-data body: {exc}") from None
    return parts
