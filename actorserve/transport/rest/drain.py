"""Graceful shutdown of a REST port: :class:`Drain`, an ASGI wrapper around the app.

The shutdown of a REST port, in order (driven by :func:`actorserve.server.serve_transports`):

1. :meth:`Drain.start`: every new request, on a new connection or a kept-alive one, is
   answered 503 with ``Retry-After`` and ``Connection: close``, in its API's error shape
   (OIP, OpenAI, TorchServe); ``GET /metrics`` is still served. The requests in flight go
   on; :attr:`Drain.idle` is set once none is left (an idle server stops at once).
2. :meth:`Drain.end_all`, at the end of the grace period: every request still running
   is cancelled (which cancels it in the engine) and its response is ended properly, never
   cut: one not started yet gets the 503; an OIP event stream a last ``event: error``
   with the OIP error body (and ``event: end`` on ``GET .../generate_stream``, which
   always ends with it); an OpenAI stream the error event and ``data: [DONE]``; any other
   body (TorchServe's chunked streams) its terminating chunk.

Cancelling a request between two writes is safe: hypercorn writes each chunk whole,
shielded, so the last chunk follows a complete one.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
import trio

from ...errors import ShuttingDown
from ..errors import RETRY_AFTER_SECONDS
from ..exchange import EXCHANGE_KEY
from ..openai.encode import DONE, error_status_and_body, stream_error
from ..torchserve.errors import ts_error
from .asgi import ASGIReceive, ASGIScope, ASGISend
from .sse import END_FRAME, error_frame

#: what every request refused or ended by the shutdown is told
SHUTTING_DOWN: Final = "the server is shutting down"

#: paths still served while draining (a scrape during the grace period sees the drain)
_SERVED_WHILE_DRAINING: Final = frozenset({"/metrics"})
_TORCHSERVE_PREFIXES: Final = ("/predictions/", "/explanations/", "/ping", "/models")


def _api(path: str) -> str:
    """Whose error shape a path answers in: ``"openai"``, ``"torchserve"`` or ``"oip"``."""
    if path.startswith("/v1/"):
        return "openai"
    if path.startswith(_TORCHSERVE_PREFIXES):
        return "torchserve"
    return "oip"


def refusal(path: str) -> tuple[int, bytes]:
    """The 503 status and body of a request refused (or not answered) because of the shutdown."""
    error = ShuttingDown(SHUTTING_DOWN)
    api = _api(path)
    if api == "openai":
        return error_status_and_body(error)
    if api == "torchserve":
        ts = ts_error(error)
        return ts.code, ts.json()
    return 503, orjson.dumps({"error": SHUTTING_DOWN})


def stream_end(scope: ASGIScope, content_type: bytes) -> bytes:
    """The last chunk of a response body that the shutdown cuts short."""
    if not content_type.startswith(b"text/event-stream"):
        return b""
    error = ShuttingDown(SHUTTING_DOWN)
    path = scope["path"]
    if _api(path) == "openai":
        return stream_error(error) + DONE
    tail = error_frame(error)
    if scope["method"] == "GET" and path.endswith("/generate_stream"):
        tail += END_FRAME
    return tail


async def send_refusal(send: ASGISend, path: str) -> None:
    status, body = refusal(path)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
                (b"connection", b"close"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Drain:
    """Wraps the :class:`~.app.RestApp` of one REST port (which keeps each request's
    :class:`Exchange` in ``scope[EXCHANGE_KEY]``); see the module docstring. Owned by
    ``serve_transports``, which calls :meth:`start` and :meth:`end_all`."""

    def __init__(self, app: Any) -> None:
        self.app = app
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
            await send_refusal(send, scope["path"])
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
        if exchange is None or not exchange.status:  # the response has not started
            await send_refusal(send, scope["path"])
            return
        body = stream_end(scope, _content_type(exchange.headers))
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_type(headers: Any) -> bytes:
    for name, value in headers:
        if name.lower() == b"content-type":
            return bytes(value).lower()
    return b""


__all__ = ["SHUTTING_DOWN", "Drain", "refusal", "stream_end"]
