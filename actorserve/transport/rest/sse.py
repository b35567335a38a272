"""Server-sent events: framing (pure functions) and the loop that writes a response
stream as events, one write per batch of waiting responses.

One event per inference response::

    data: <JSON>\\n\\n

An error after the stream has started is one last event, after which the stream ends::

    event: error
    data: {"error": "<message>", "status": <HTTP status it would have had>}

Streams meant for a browser's ``EventSource`` end with ``event: end`` (``data: {}``) so
that the browser can close instead of reconnecting.

Writes coalesce: :func:`write_events` sends everything already waiting for a stream in
one chunk, and never waits to fill one, so a lone event goes out at once and a stream
that fell behind (a slow reader) catches up in one write.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Protocol, TypeVar

import orjson

from ...errors import ActorServeError
from ..errors import client_message, http_status

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: Headers of every event stream: no caching, and no buffering by proxies (nginx).
EVENT_STREAM_HEADERS: Final = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)

_LINE_BREAK: Final = re.compile(rb"\r\n|\r|\n")
_DATA: Final = b"data: "
_END: Final = b"\n\n"


def frame(data: bytes, event: str | None = None) -> bytes:
    """One SSE event. ``data`` may span lines: each becomes its own ``data:`` field."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    if b"\n" not in data and b"\r" not in data:
        return head + _DATA + data + _END
    lines = _LINE_BREAK.split(data)
    return head + b"".join(_DATA + line + b"\n" for line in lines) + b"\n"


#: The last event of an ``EventSource`` stream.
END_FRAME: Final = frame(b"{}", event="end")


def error_frame(error: BaseException) -> bytes:
    """The ``event: error`` for ``error``, with the status the one error table gives it."""
    status = http_status(error)
    if not isinstance(error, ActorServeError):
        log.error("a response stream failed", exc_info=error)
    return frame(orjson.dumps({"error": client_message(error), "status": status}), event="error")


def data_frames(items: Sequence[T], encode: Callable[[T], bytes]) -> bytes:
    """One ``data:`` event per item, joined: what one write carries."""
    parts: list[bytes] = []
    append = parts.append
    for item in items:
        data = encode(item)
        if b"\n" in data or b"\r" in data:  # never for orjson's output
            append(frame(data))
        else:
            append(_DATA)
            append(data)
            append(_END)
    return b"".join(parts)


class Batches(Protocol[T_co]):
    """What :func:`write_events` reads (an engine :class:`~actorserve.api.ResponseIterator`)."""

    async def next_batch(self) -> Sequence[T_co]: ...


#: ``send(chunk)``: write one chunk of the body (more follows).
SendChunk = Callable[[bytes], Awaitable[None]]


async def write_events(
    first: Sequence[T],
    rest: Batches[T],
    encode: Callable[[T], bytes],
    send: SendChunk,
    *,
    end_event: bool = False,
    on_sent: Callable[[int], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> bytes:
    """Write a response stream whose first batch was already pulled (empty when the
    stream turned out empty), then each later batch as one chunk, as soon as
    ``rest.next_batch()`` returns it. Returns the last chunk (an error event and/or
    ``event: end``, possibly empty), for the caller to send as the end of the body once
    it has left the engine's stream: a client that sees the end finds the request gone.

    An exception from ``rest`` (or from ``encode``) becomes an error event and ends the
    stream; cancellation and errors from ``send`` propagate. The caller owns ``rest``:
    leaving the engine's stream context is what cancels the request there.

    ``on_sent(n)`` is called after each write of ``n`` responses, ``on_error(exc)`` for
    the error that ended the stream (both for the metrics)."""
    batch: Sequence[T] = first
    error: BaseException | None = None
    while True:
        if batch:
            try:
                chunk = data_frames(batch, encode)
            except Exception as exc:
                error = exc
                break
            await send(chunk)
            if on_sent is not None:
                on_sent(len(batch))
        try:
            batch = await rest.next_batch()
        except StopAsyncIteration:
            break
        except Exception as exc:
            error = exc
            break
    tail = b""
    if error is not None:
        tail = error_frame(error)
        if on_error is not None:
            on_error(error)
    return tail + END_FRAME if end_event else tail
