"""Whole HTTP replies as raw ASGI: what the HTTP host sends itself (401, a CORS
preflight, ``/metrics``, a 503 while draining) and every door's complete answers
(:func:`send_whole`), and the ASGI aliases every door types with. No I/O beyond the
``send`` it is given."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import orjson

ASGIScope = Mapping[str, Any]
ASGIReceive = Callable[[], Awaitable[Any]]
ASGISend = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[ASGIScope, ASGIReceive, ASGISend], Awaitable[None]]


@attrs.frozen
class Reply:
    """A complete answer: status, headers (``(name, value)`` text), body."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


def json_reply(value: Any, status: int, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    return Reply(status, [("Content-Type", "application/json"), *headers], orjson.dumps(value))


async def send_reply(send: ASGISend, reply: Reply) -> None:
    """Send ``reply`` whole, with its ``Content-Length``."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers]
    await send_whole(send, reply.status, raw, reply.body)


async def send_whole(
    send: ASGISend, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> None:
    """Send a complete answer: ``status``, ``headers`` (raw ASGI pairs, lower-case) and
    its ``Content-Length``, then ``body`` in one message. Every door's whole replies go
    through here (or :func:`send_reply`)."""
    raw = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


__all__ = [
    "ASGIApp",
    "ASGIReceive",
    "ASGIScope",
    "ASGISend",
    "Reply",
    "json_reply",
    "send_reply",
    "send_whole",
]
