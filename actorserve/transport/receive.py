"""Reading an ASGI request on the raw paths (OIP, OpenAI, TorchServe): the whole body
under a limit, and a watch that cancels the work when the client goes away."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from ..errors import BadInput
from .errors import BodyTooLarge

ASGIReceive = Callable[[], Awaitable[Any]]


class Disconnected(Exception):
    """The client went away before its request body was read."""


def too_large(scope: Mapping[str, Any], limit: int) -> bool:
    """True when the request's Content-Length announces a body over ``limit``: the
    routes that refuse it this way answer 413 without reading a byte of it."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value) > limit
            except ValueError:
                return False  # the HTTP parser has refused it already
    return False


async def read_body(receive: ASGIReceive, limit: int, content_length: str | None = None) -> bytes:
    """The whole body. :class:`BodyTooLarge` as soon as it is known to be over ``limit``
    (from ``content_length``, before reading), :class:`BadInput` for a Content-Length
    that is not a number, :class:`Disconnected`."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise BadInput("invalid Content-Length") from None
        if declared > limit:
            raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return b"".join((*chunks, chunk)) if chunks else chunk  # one message: no copy
        chunks.append(chunk)


async def cancel_on_disconnect(
    receive: ASGIReceive, scope: trio.CancelScope, on_disconnect: Callable[[], None] | None = None
) -> None:
    """Cancel ``scope`` (after ``on_disconnect``) when the client goes away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if on_disconnect is not None:
                on_disconnect()
            scope.cancel()
            return


__all__ = ["BodyTooLarge", "Disconnected", "cancel_on_disconnect", "read_body", "too_large"]
