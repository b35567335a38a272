"""Reading an ASGI request on the raw paths (OIP, OpenAI, TorchServe): the whole body
under a limit, and a watch that cancels the work when the client goes away."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from ..errors import BadInput
from .errors import BodyTimeout, BodyTooLarge

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


def body_deadline(receive: ASGIReceive, seconds: float) -> ASGIReceive:
    """``receive`` that raises :class:`BodyTimeout` when the request body is not complete
    within ``seconds`` from now (the head has arrived; 0: no limit). Once the body is
    complete it is ``receive`` itself, so watching for a disconnect is never timed.

    A slow-loris body is thus answered 408 before any model work starts: the routes read
    the whole body before they call the engine."""
    if not seconds:
        return receive
    deadline = trio.current_time() + seconds
    complete = False
    # hypercorn hands the app a memory channel's receive: a body that has already arrived
    # (nearly every request) is taken without a timed cancel scope, which costs a few
    # microseconds per request on the hot path
    channel = getattr(receive, "__self__", None)
    nowait = channel.receive_nowait if isinstance(channel, trio.MemoryReceiveChannel) else None

    async def receive_in_time() -> Any:
        nonlocal complete
        if complete:
            return await receive()
        if nowait is not None:
            try:
                message = nowait()
            except trio.WouldBlock:
                pass
            else:
                if message["type"] != "http.request" or not message.get("more_body", False):
                    complete = True
                return message
        with trio.move_on_at(deadline):
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message
        raise BodyTimeout(f"the request body did not arrive within {seconds:g} s (read_timeout)")

    return receive_in_time


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


__all__ = [
    "BodyTimeout",
    "BodyTooLarge",
    "Disconnected",
    "body_deadline",
    "cancel_on_disconnect",
    "read_body",
    "too_large",
]
