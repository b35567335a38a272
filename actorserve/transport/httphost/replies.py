"""What the HTTP host sends itself, as raw ASGI: complete JSON replies (401, a CORS
preflight, ``/metrics``, a 503 while draining). No I/O beyond the ``send`` it is given."""

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
    raw.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": raw})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


__all__ = ["ASGIApp", "ASGIReceive", "ASGIScope", "ASGISend", "Reply", "json_reply", "send_reply"]
