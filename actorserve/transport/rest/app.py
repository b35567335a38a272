"""The ASGI application handed to hypercorn: the raw paths of :mod:`.asgi` first
(``infer``, ``generate`` and every stream), the OpenAI API under ``/v1/``
(:mod:`actorserve.transport.openai`), Quart (:mod:`.views`) for the rest.

Every request's target is read once (:mod:`.target`): one that is not a canonical
origin-form path is refused with 400 before CORS, auth or routing, and the path that
routes is the path whose door said which auth scope it is in. Only HTTP (and lifespan)
scopes are served; a WebSocket is closed unaccepted (hypercorn answers 403).

Every error a client sees is ``{"error": "<message>"}`` JSON with a meaningful status,
including unknown routes (404), wrong methods (405) and oversized bodies (413).
"""

from __future__ import annotations

import re
from typing import Final

import trio
from quart import Response, request
from quart.wrappers.response import DataBody
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ...api import EngineAPI
from ...metrics import CONTENT_TYPE, Metrics
from ...replica import replica_id
from ...settings import Settings
from ..access import AccessLog
from ..auth import CHALLENGE, METRICS_PATH, UNAUTHORIZED, Guard, Scope
from ..exchange import EXCHANGE_KEY, Exchange, Recorder
from ..openai import OpenAIRoutes
from ..playground import register_playground
from ..receive import body_deadline, too_large
from ..torchserve import TorchServeInference, TorchServeManagement, not_on_management_port, on_management_port
from ..torchserve.errors import TsError
from ..torchserve.rest import send_error as send_ts_error
from .asgi import ASGIReceive, ASGIScope, ASGISend, RawRoutes, gzip_if_wanted, reply_for, send_reply
from .cors import Cors
from .management_routes import MANAGEMENT_PREFIX, ManagementViews, register_management
from .management_routes import auth_scope as management_scope
from .openapi import DOCUMENT_PATH, openapi_document
from .sequence_headers import naming_for
from .target import refusal
from .views import RestViews, http_error_reply, response
from .wire import GZIP_HEADERS, HttpReply, json_reply, method_not_allowed_reply, too_large_reply

#: ``/v2/models/{name}[/versions/{version}]/{op}`` for the operations on the raw path.
_MODEL_OP: Final = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([^/]+))?/(infer|infer_stream|generate|generate_stream)"
)

#: op -> the methods it allows.
_RAW_METHODS: Final = {
    "infer": ("POST",),
    "infer_stream": ("POST",),
    "generate": ("POST",),
    "generate_stream": ("GET", "POST"),
}


class RestApp:
    """The ASGI application serving one engine.

    ``infer``, ``generate`` and the streams take the raw path (``infer`` only when
    ``fast_path``; otherwise a Quart view serves it, for comparisons); everything else
    goes through ``quart``."""

    def __init__(
        self,
        engine: EngineAPI,
        settings: Settings,
        quart: QuartTrio,
        *,
        fast_path: bool = True,
        recorder: Recorder,
        guard: Guard | None = None,
        torchserve_management: bool = False,
    ) -> None:
        self.engine = engine
        #: a port of TorchServe's management paths (and /ping) only: the rest is 404 there
        self.torchserve_management_only = torchserve_management
        self.settings = settings
        self.quart = quart
        self.fast_path = fast_path
        self.recorder = recorder
        self.guard = guard if guard is not None and guard.active else None
        naming = naming_for(settings.sequence_headers, replica_id(settings.replica_id))
        self.raw = RawRoutes(engine, settings.max_body_bytes, settings.gzip_min_bytes, recorder, naming)
        self.cors = Cors(settings.cors_allow_origin) if settings.cors_allow_origin else None
        self.openai = OpenAIRoutes(engine, settings.max_body_bytes)
        #: TorchServe's inference paths (/ping, /predictions, /explanations)
        self.torchserve = TorchServeInference(engine, settings.max_body_bytes)
        #: TorchServe's management paths (/models...), kept apart: they are management
        self.torchserve_management = TorchServeManagement(engine)

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            await self.quart(scope, receive, send)  # type: ignore[arg-type]
            return
        if scope["type"] != "http":  # no door serves WebSockets: never hand one on unguarded
            await _refuse_other(scope, receive, send)
            return
        why = refusal(scope)
        if why is not None:  # first: nothing below may read a second meaning into it
            await self._bad_target(scope, send, why)
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
        scope[EXCHANGE_KEY] = exchange  # type: ignore[index]  # hypercorn's dict; what Drain reads if the shutdown ends this request
        quart_receive = receive  # Quart times its own body reads (BODY_TIMEOUT)
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

        match = _MODEL_OP.fullmatch(path)
        try:
            if self.torchserve_management_only and not on_management_port(path):
                await not_on_management_port(tracked)
            elif self.guard is not None and not self._authorized(scope, self._auth_scope(path, match)):
                await send_reply(tracked, _UNAUTHORIZED_REPLY)
            elif match is not None and (self.fast_path or match[3] != "infer"):
                op = match[3]
                allowed = _RAW_METHODS[op]
                exchange.model_request(match[1], match[2])
                self.recorder.open(exchange)
                if scope["method"] in allowed:
                    await self.raw.serve(op, scope, receive, tracked, match[1], match[2], exchange)
                else:
                    await send_reply(tracked, method_not_allowed_reply(scope["method"], path, allowed))
            elif path.startswith("/v1/"):  # the OpenAI API
                await self.openai(scope, receive, tracked)
            elif too_large(scope, self.settings.max_body_bytes):  # refused unread, read or not
                await self._too_large(path, tracked)
            elif path == METRICS_PATH:
                await self._metrics(scope, tracked)
            elif await self.torchserve.serve(scope, receive, tracked):
                pass
            elif await self.torchserve_management.serve(scope, receive, tracked):
                pass
            else:
                if match is not None:
                    exchange.model_request(match[1], match[2])
                    self.recorder.open(exchange)
                    scope = {
                        **scope,
                        "extensions": {**(scope.get("extensions") or {}), "actorserve": exchange},
                    }
                elif path.startswith(MANAGEMENT_PREFIX):  # for the access line
                    exchange.model = path[len(MANAGEMENT_PREFIX) :].split("/", 1)[0]
                await self.quart(scope, quart_receive, tracked)  # type: ignore[arg-type]
        finally:
            self.recorder.finish(exchange, exchange.outcome())

    async def _too_large(self, path: str, send: ASGISend) -> None:
        """413 for a body announced over ``max_body_bytes``, in the route family's error
        format, before any of it is read (the protocol then closes the connection)."""
        limit = self.settings.max_body_bytes
        if on_management_port(path) or path.startswith(("/predictions/", "/explanations/")):
            message = f"request body is over {limit} bytes (max_body_bytes)"
            await send_ts_error(send, TsError(413, "RequestTooLargeException", message))
        else:
            await send_reply(send, too_large_reply(limit))

    async def _bad_target(self, scope: ASGIScope, send: ASGISend, why: str) -> None:
        """400 for a target :func:`.target.refusal` refused, recorded as any request (the
        access log escapes what the client sent)."""
        path = scope.get("path") or ""
        exchange = Exchange("rest", scope["method"], path)
        exchange.status, exchange.complete = 400, True
        try:
            # in the error format of the family the path would belong to, as every
            # other refusal of that family (a client's error handling reads that shape)
            if path.startswith("/v1/"):
                await self.openai.refuse(send, why)
            elif on_management_port(path) or path.startswith(("/predictions/", "/explanations/")):
                await send_ts_error(send, TsError(400, "BadRequestException", why))
            else:
                await send_reply(send, json_reply({"error": why}, 400))
        finally:
            self.recorder.finish(exchange, exchange.outcome())

    def _auth_scope(self, path: str, match: re.Match[str] | None) -> Scope | None:
        """The scope of ``path`` as the door that serves it says. The doors own disjoint
        paths (``/v2/...``, ``/v1/...``, ``/metrics``, TorchServe's ``/predictions/``,
        ``/explanations/``, ``/ping`` and ``/models``), so the first to claim it is the
        one that routes it below."""
        if match is not None:  # a model's infer / generate, on the raw path or Quart's
            return Scope.INFERENCE
        if path.startswith("/v1/"):
            return self.openai.auth_scope(path)
        if path == METRICS_PATH:
            return Scope.METRICS
        return (
            management_scope(path)
            or self.torchserve.auth_scope(path)
            or self.torchserve_management.auth_scope(path)
        )

    def _authorized(self, scope: ASGIScope, kind: Scope | None) -> bool:
        assert self.guard is not None
        if self.guard.needs(kind) is None or scope["method"] == "OPTIONS":
            return True  # a CORS preflight never carries the Authorization header
        for key, value in scope["headers"]:
            if key == b"authorization":
                return self.guard.allows(value)
        return False

    async def _metrics(self, scope: ASGIScope, send: ASGISend) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            await send_reply(send, method_not_allowed_reply(scope["method"], scope["path"], ("GET",)))
            return
        self.recorder.metrics.refresh()  # this process's live gauges, as of now
        body = await trio.to_thread.run_sync(self.recorder.metrics.expose)
        await send_reply(send, HttpReply(200, [("Content-Type", CONTENT_TYPE)], body))


_UNAUTHORIZED_REPLY: Final = json_reply({"error": UNAUTHORIZED}, 401, [CHALLENGE])


async def _refuse_other(scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
    """A scope no door serves: a WebSocket is closed before it is accepted (hypercorn
    answers the handshake 403); any other kind gets nothing."""
    if scope["type"] == "websocket":
        message = await receive()
        if message.get("type") == "websocket.connect":
            await send({"type": "websocket.close", "code": 1008, "reason": "WebSockets are not served"})


_QUART_MODEL_ROUTES: Final = (
    ("", "model_metadata", ("GET",)),
    ("/ready", "model_ready", ("GET",)),
    ("/infer", "infer", ("POST",)),  # reached only when the raw path is off
    ("/config", "model_config", ("GET",)),
    ("/stats", "model_stats", ("GET",)),
)


def create_app(
    engine: EngineAPI,
    settings: Settings,
    *,
    fast_path: bool = True,
    metrics: Metrics | None = None,
    access: AccessLog | None = None,
    guard: Guard | None = None,
    torchserve_management: bool = False,
) -> RestApp:
    """The ASGI application serving ``engine``. ``POST /v2/repository/models/{name}/load``
    calls ``engine.load_from_repository``. ``fast_path=False`` sends ``infer`` through
    Quart too (for comparison). Requests are recorded in ``metrics`` (default: a fresh
    :class:`Metrics`, which ``GET /metrics`` shows) and ``access`` (the access log, if
    on); ``guard`` decides which routes need a bearer token (None: none).
    ``torchserve_management``: serve only TorchServe's management paths and ``/ping``
    (its management port)."""
    views = RestViews(engine, settings)
    app = QuartTrio("actorserve")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["BODY_TIMEOUT"] = settings.read_timeout or None  # 408 past it, as on the raw paths
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    def route(rule: str, endpoint: str, methods: tuple[str, ...]) -> None:
        app.add_url_rule(rule, endpoint, getattr(views, endpoint), methods=list(methods))

    route("/v2/health/live", "live", ("GET",))
    route("/v2/health/ready", "ready", ("GET",))
    route("/v2", "server_metadata", ("GET",))
    app.add_url_rule("/v2/", "server_metadata_slash", views.server_metadata, methods=["GET"])
    route("/v2/repository/index", "repository_index", ("GET", "POST"))
    route("/v2/models/stats", "model_stats", ("GET",))  # every model's (Triton)
    # Management (load, unload, workers, default version, describe): one place, see
    # management_routes.py; the token check (transport/auth.py) covers them by their prefix.
    register_management(app, ManagementViews(engine, settings))
    document = openapi_document()

    async def dataplane_document() -> Response:
        return response(json_reply(document))

    app.add_url_rule(DOCUMENT_PATH, "openapi", dataplane_document, methods=["GET"])
    for suffix, endpoint, methods in _QUART_MODEL_ROUTES:
        route(f"/v2/models/<name>{suffix}", endpoint, methods)
        app.add_url_rule(
            f"/v2/models/<name>/versions/<version>{suffix}",
            f"{endpoint}_version",
            getattr(views, endpoint),
            methods=list(methods),
        )

    async def on_error(error: Exception) -> Response:
        if isinstance(error, HTTPException):
            return response(http_error_reply(error, settings.max_body_bytes))
        return response(reply_for(error, settings.max_body_bytes))

    app.register_error_handler(Exception, on_error)

    async def compress(reply: Response) -> Response:
        body = reply.response
        if isinstance(body, DataBody):
            packed = await gzip_if_wanted(
                body.data,
                "Content-Encoding" in reply.headers,
                request.headers.get("Accept-Encoding"),
                settings.gzip_min_bytes,
            )
            if packed is not None:
                reply.set_data(packed)
                reply.headers.update(GZIP_HEADERS)
        return reply

    app.after_request(compress)
    register_playground(app)
    recorder = Recorder(metrics if metrics is not None else Metrics(), access)
    return RestApp(
        engine,
        settings,
        app,
        fast_path=fast_path,
        recorder=recorder,
        guard=guard,
        torchserve_management=torchserve_management,
    )
