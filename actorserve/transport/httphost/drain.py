"""Graceful shutdown of a REST port: :class:`Drain`, an ASGI wrapper around the app.

The shutdown of a REST port, in order (driven by :func:`actorserve.server.composition.serve_transports`):

1. :meth:`Drain.start`: every new request, on a new connection or a kept-alive one, is
   answered 503 with ``Retry-After`` and ``Connection: close``, in the error shape of
   the door whose path it is (:meth:`.door.HttpDoor.shutting_down`); ``GET /metrics`` is
   still served. The requests in flight go on; :attr:`Drain.idle` is set once none is
   left (an idle server stops at once).
2. :meth:`Drain.end_all`, at the end of the grace period: every request still running
   is cancelled (which cancels it in the engine) and its response is ended properly, never
   cut: one not started yet gets the 503; an event stream the last events its door gives
   (:meth:`.door.HttpDoor.stream_end`: an OIP stream a last ``event: error`` with the OIP
   error body, and ``event: end`` on ``GET .../generate_stream``, which always ends with
   it; an OpenAI stream the error event and ``data: [DONE]``); any other body
   (TorchServe's chunked streams) its terminating chunk.

Cancelling a request between two writes is safe: hypercorn writes each chunk whole,
shielded, so the last chunk follows a complete one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import trio

from ..errors import RETRY_AFTER_SECONDS
from ..exchange import EXCHANGE_KEY
from .door import HttpDoor
from .replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend, send_whole

#: what every request refused or ended by the shutdown is told
SHUTTING_DOWN: Final = "the server is shutting down"

#: paths still served while draining (a scrape during the grace period sees the drain)
_SERVED_WHILE_DRAINING: Final = frozenset({"/metrics"})


async def send_refusal(send: ASGISend, door: HttpDoor) -> None:
    """The 503 of a request refused (or not answered) because of the shutdown, in the
    error shape of the door whose path it is."""
    status, body = door.shutting_down(SHUTTING_DOWN)
    headers = [
        (b"content-type", b"application/json"),
        (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
        (b"connection", b"close"),
    ]
    await send_whole(send, status, headers, body)


def stream_end(door: HttpDoor, scope: ASGIScope, content_type: bytes) -> bytes:
    """The last chunk of a response body that the shutdown cuts short: an event stream's
    last events in its door's shape; any other body just ends."""
    if not content_type.startswith(b"text/event-stream"):
        return b""
    return door.stream_end(scope["method"], scope["path"], SHUTTING_DOWN)


class Drain:
    """Wraps the :class:`~.host.HttpHost` of one REST port (which keeps each request's
    :class:`Exchange` in ``scope[EXCHANGE_KEY]``); see the module docstring. ``door_for``
    (the host's) says whose error shape a path answers in. Owned by
    ``serve_transports``, which calls :meth:`start` and :meth:`end_all`."""

    def __init__(self, app: ASGIApp, door_for: Callable[[str], HttpDoor]) -> None:
        self.app = app
        self.door_for = door_for
        self.draining = False
        #: set once draining and no request is running
        self.idle = trio.Event()
        self._running: set[trio.CancelScope] = set()

    @property
    def running(self) -> int:
        """Requests in the app right now."""
        return len(self._running)

    def start(self) -> None:
        """Refuse new requests from now on; :attr:`idle` is set when the last one ends."""
        self.draining = True
        if not self._running:
            self.idle.set()

    def end_all(self) -> None:
        """End every request still running (see the module docstring)."""
        for scope in self._running:
            scope.cancel()

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining and scope["path"] not in _SERVED_WHILE_DRAINING:
            await send_refusal(send, self.door_for(scope["path"]))
            return
        with trio.CancelScope() as cancel:
            self._running.add(cancel)
            try:
                await self.app(scope, receive, send)  # it records what it sent in scope[EXCHANGE_KEY]
            finally:
                self._running.discard(cancel)
                if self.draining and not self._running:
                    self.idle.set()
        if not cancel.cancelled_caught:
            return
        exchange = scope.get(EXCHANGE_KEY)
        if exchange is not None and exchange.complete:
            return
        door = self.door_for(scope["path"])
        if exchange is None or not exchange.status:  # the response has not started
            await send_refusal(send, door)
            return
        body = stream_end(door, scope, _content_type(exchange.headers))
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_type(headers: Any) -> bytes:
    for name, value in headers:
        if name.lower() == b"content-type":
            return bytes(value).lower()
    return b""


__all__ = ["SHUTTING_DOWN", "Drain", "send_refusal", "stream_end"]
