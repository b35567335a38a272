""":class:`HttpHost`: the ASGI application of a REST port, for every HTTP door.

It owns what every request shares, in this order: only HTTP (and lifespan) scopes are
served (a WebSocket is closed unaccepted: hypercorn answers 403); the target is read
once (:mod:`.target`: anything but a canonical origin-form path is refused 400 before
CORS, auth or routing, in the error shape of the door the path would belong to); a
browser's request from another origin than the server's own or one ``--cors-allow-origin``
allows is refused 403 unread (:func:`.cors.foreign_origin`: a simple request needs no
preflight, so CORS alone would let any page make the server work); CORS
(a preflight is answered before auth: it has no token); the door that claims the path
says which auth scope it is in, and the guard whether that scope needs a token (401
with ``WWW-Authenticate: Bearer``); ``GET /metrics`` and the port's OpenAPI document
(``GET /v2/docs/dataplane.json``, assembled from the doors' parts: :mod:`.openapi`); every request's
:class:`~actorserve.transport.exchange.Exchange`, finished here whatever the door did,
so every door's requests are in the metrics and the access log. The drain
(:mod:`.drain`) wraps it and asks it whose error shape a path answers in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import trio

from ...metrics import CONTENT_TYPE
from ...settings import Settings
from ..auth import CHALLENGE, FORBIDDEN, METRICS_PATH, UNAUTHORIZED, Guard, Scope, Verdict
from ..exchange import EXCHANGE_KEY, Exchange, Recorder
from ..receive import body_deadline, too_large
from .cors import Cors, foreign_origin, refusal_text
from .door import UNTIMED_RECEIVE_KEY, HttpDoor
from .openapi import DOCUMENT_PATH, document, host_part
from .replies import ASGIReceive, ASGIScope, ASGISend, Reply, json_reply, send_reply
from .target import refusal

if TYPE_CHECKING:
    from ...otel import RequestSpan, RequestTracer

#: paths whose requests make no span: probes and scrapes, every few seconds, with no trace
UNTRACED_PATHS: Final = frozenset({METRICS_PATH, "/v2/health/live", "/v2/health/ready", "/ping"})
_UNAUTHORIZED_REPLY: Final = json_reply({"error": UNAUTHORIZED}, 401, [CHALLENGE])
_FORBIDDEN_REPLY: Final = json_reply({"error": FORBIDDEN}, 403)


class HttpHost:
    """The ASGI application of one REST port: ``doors`` in the server's order (the last
    should claim every path), recorded by ``recorder``; ``guard`` decides which scopes
    need a bearer token (None: none). ``metrics=False``: ``/metrics`` and the OpenAPI
    document are left to the doors (a port that serves one door alone)."""

    def __init__(
        self,
        doors: Sequence[HttpDoor],
        settings: Settings,
        recorder: Recorder,
        *,
        guard: Guard | None = None,
        metrics: bool = True,
    ) -> None:
        if not doors:
            raise ValueError("an HTTP host needs at least one door")
        self.doors = tuple(doors)
        self.settings = settings
        self.recorder = recorder
        self.guard = guard if guard is not None and guard.active else None
        self.serves_metrics = metrics
        self.cors = Cors(settings.cors_allow_origin) if settings.cors_allow_origin else None
        self.lifespan = next((d.lifespan for d in self.doors if d.lifespan is not None), None)
        #: the port's OpenAPI document: the host's routes and every door's part
        self.document = document([*(door.openapi() for door in self.doors), host_part(own_routes=metrics)])
        self._document_reply = json_reply(self.document, 200)

    def door_for(self, path: str) -> HttpDoor:
        """The door that claims ``path`` (the last door when none does)."""
        for door in self.doors:
            if door.claims(path):
                return door
        return self.doors[-1]

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http":  # no door serves WebSockets: never hand one on unguarded
            await _refuse_other(scope, receive, send)
            return
        why = refusal(scope)
        if why is not None:  # first: nothing below may read a second meaning into it
            await self._bad_target(scope, send, why)
            return
        origin = foreign_origin(scope, self.cors)
        if origin is not None:  # a page of another origin: refused unread, preflight or not
            await self._refuse_origin(scope, send, origin)
            return
        if self.cors is not None:  # first: a preflight is answered before auth (it has no token)
            origin, origin_ok = self.cors.allowed(scope)
            if origin is not None:
                if self.cors.is_preflight(scope):
                    await send_reply(send, self.cors.preflight(scope, origin, origin_ok))
                    return
                if origin_ok:
                    send = self.cors.wrap(send, origin)
        path: str = scope["path"]
        exchange = Exchange("rest", scope["method"], path)
        exchange.recorder = self.recorder  # a door's model_request opens it (in flight)
        if self.recorder.tracer is not None and path not in UNTRACED_PATHS:
            exchange.span = _request_span(self.recorder.tracer, scope)
        scope[EXCHANGE_KEY] = exchange  # type: ignore[index]  # hypercorn's dict; what Drain reads if the shutdown ends this request
        scope[UNTIMED_RECEIVE_KEY] = receive  # type: ignore[index]  # Quart times its own body reads (BODY_TIMEOUT)
        receive = body_deadline(receive, self.settings.read_timeout)

        async def tracked(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]  # type: ignore[assignment]
                exchange.headers = message.get("headers", ())
            else:
                exchange.bytes += len(message.get("body", b""))  # type: ignore[arg-type, operator]
                if not message.get("more_body", False):
                    exchange.complete = True
            await send(message)

        own = self.serves_metrics and path in (METRICS_PATH, DOCUMENT_PATH)  # the host's own routes
        door = None if own else self.door_for(path)
        try:
            kind = (
                door.auth_scope(path) if door is not None else Scope.METRICS if path == METRICS_PATH else None
            )
            verdict = Verdict.ALLOWED if self.guard is None else self._verdict(scope, kind)
            if verdict is Verdict.UNAUTHORIZED:
                await send_reply(tracked, _UNAUTHORIZED_REPLY)
            elif verdict is Verdict.FORBIDDEN:
                await send_reply(tracked, _FORBIDDEN_REPLY)
            elif door is not None:
                await door.serve(scope, receive, tracked, exchange)
            elif too_large(scope, self.settings.max_body_bytes):  # refused unread, read or not
                limit = self.settings.max_body_bytes
                message = f"the request body is larger than {limit} bytes (max_body_bytes)"
                await send_reply(tracked, json_reply({"error": message}, 413))
            elif path == METRICS_PATH:
                await self._metrics(scope, tracked)
            else:
                await self._document(scope, tracked)
        finally:
            self.recorder.finish(exchange, exchange.outcome())

    async def _lifespan(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        """The lifespan of the door whose framework needs one, else nothing to start."""
        if self.lifespan is not None:
            await self.lifespan(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _bad_target(self, scope: ASGIScope, send: ASGISend, why: str) -> None:
        """400 for a target :func:`.target.refusal` refused, recorded as any request (the
        access log escapes what the client sent), in the error format of the door the
        path would belong to, as every other refusal of that door (a client's error
        handling reads that shape)."""
        path = scope.get("path") or ""
        exchange = Exchange("rest", scope["method"], path)
        exchange.status, exchange.complete = 400, True
        try:
            status, body = self.door_for(path).bad_target(why)
            await send_reply(send, Reply(status, [("Content-Type", "application/json")], body))
        finally:
            self.recorder.finish(exchange, exchange.outcome())

    async def _refuse_origin(self, scope: ASGIScope, send: ASGISend, origin: str) -> None:
        """403 for a browser request from another origin (:func:`.cors.foreign_origin`),
        before its body is read, in the error shape of the door the path belongs to,
        recorded as any request."""
        path: str = scope["path"]
        exchange = Exchange("rest", scope["method"], path)
        exchange.status, exchange.complete = 403, True
        try:
            status, body = self.door_for(path).forbidden(refusal_text(origin))
            await send_reply(send, Reply(status, [("Content-Type", "application/json")], body))
        finally:
            self.recorder.finish(exchange, exchange.outcome())

    def _verdict(self, scope: ASGIScope, kind: Scope | None) -> Verdict:
        assert self.guard is not None
        needed = self.guard.needs(kind)
        if needed is None or scope["method"] == "OPTIONS":
            return Verdict.ALLOWED  # a CORS preflight never carries the Authorization header
        for key, value in scope["headers"]:
            if key == b"authorization":
                return self.guard.verdict(needed, value)
        return Verdict.UNAUTHORIZED

    async def _document(self, scope: ASGIScope, send: ASGISend) -> None:
        if await _only_get(scope, send):
            await send_reply(send, self._document_reply)

    async def _metrics(self, scope: ASGIScope, send: ASGISend) -> None:
        if not await _only_get(scope, send):
            return
        self.recorder.metrics.refresh()  # this process's live gauges, as of now
        body = await trio.to_thread.run_sync(self.recorder.metrics.expose)
        await send_reply(send, Reply(200, [("Content-Type", CONTENT_TYPE)], body))


def _request_span(tracer: RequestTracer, scope: ASGIScope) -> RequestSpan:
    """The span of the HTTP request ``scope``, child of the client's ``traceparent``."""
    parent = state = None
    for key, value in scope["headers"]:
        if key == b"traceparent":
            parent = value.decode("latin-1")
        elif key == b"tracestate":
            state = value.decode("latin-1")
    method: str = scope["method"]
    path: str = scope["path"]
    attributes = {"http.request.method": method, "url.path": path}
    return tracer.start(f"{method} {path}", "rest", attributes, parent, state)


async def _only_get(scope: ASGIScope, send: ASGISend) -> bool:
    """True for a GET or HEAD; anything else is answered 405 here."""
    if scope["method"] in ("GET", "HEAD"):
        return True
    message = f"method {scope['method']} is not allowed on {scope['path']}"
    await send_reply(send, json_reply({"error": message}, 405, [("Allow", "GET")]))
    return False


async def _refuse_other(scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
    """A scope no door serves: a WebSocket is closed before it is accepted (hypercorn
    answers the handshake 403); any other kind gets nothing."""
    if scope["type"] == "websocket":
        message = await receive()
        if message.get("type") == "websocket.connect":
            await send({"type": "websocket.close", "code": 1008, "reason": "WebSockets are not served"})


__all__ = ["UNTRACED_PATHS", "HttpHost"]
