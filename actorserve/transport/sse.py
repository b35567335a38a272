"""Server-sent events: framing (pure functions) and the streaming body of a response.

One event per inference response::

    data: <JSON>\\n\\n

An error after the stream has started is one last event, after which the stream ends::

    event: error
    data: {"error": "<message>", "status": <HTTP status it would have had>}

Streams meant for a browser's ``EventSource`` end with ``event: end`` (``data: {}``) so
that the browser can close instead of reconnecting.

Ownership: :func:`event_frames` owns the response iterator it is given and closes it when
it ends, fails or is closed (by the web framework when the client goes away), which is
what cancels the request in the engine.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncGenerator, Callable
from typing import Final, TypeVar

import orjson

from ..errors import ActorServeError
from .errors import client_message, http_status

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Headers of every event stream: no caching, and no buffering by proxies (nginx).
EVENT_STREAM_HEADERS: Final = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def frame(data: bytes, event: str | None = None) -> bytes:
    """One SSE event. ``data`` may span lines: each becomes its own ``data:`` field."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    if b"\n" not in data and b"\r" not in data:
        return head + b"data: " + data + b"\n\n"
    lines = _LINE_BREAK.split(data)
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


#: The last event of an ``EventSource`` stream.
END_FRAME: Final = frame(b"{}", event="end")


def error_frame(error: BaseException) -> bytes:
    """The ``event: error`` for ``error``, with the status the one error table gives it."""
    status = http_status(error)
    if not isinstance(error, ActorServeError):
        log.error("a response stream failed", exc_info=error)
    return frame(orjson.dumps({"error": client_message(error), "status": status}), event="error")


async def event_frames(
    first: T | None,
    rest: AsyncGenerator[T, None],
    encode: Callable[[T], bytes],
    *,
    end_event: bool = False,
) -> AsyncGenerator[bytes, None]:
    """The SSE frames of a response stream whose first item was already pulled.

    ``first`` is None when the stream turned out empty. Each item is framed as soon as
    ``rest`` yields it. An exception from ``rest`` becomes an error event and ends the
    stream; cancellation (the client went away) propagates. ``rest`` is closed in every
    case.
    """
    try:
        if first is not None:
            yield frame(encode(first))
            async for item in rest:
                yield frame(encode(item))
    except Exception as exc:
        yield error_frame(exc)
    finally:
        await rest.aclose()
    if end_event:
        yield END_FRAME
