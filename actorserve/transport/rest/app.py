"""The OIP's REST door (:class:`OipRest`): the raw paths of :mod:`.asgi` first
(``infer``, ``generate`` and every stream), Quart (:mod:`.views`) for the rest.

The HTTP host (:mod:`actorserve.transport.httphost`) hands it every path no other door
claims, after the host's target check, CORS and auth. Every error a client sees is
``{"error": "<message>"}`` JSON with a meaningful status, including unknown routes
(404), wrong methods (405) and oversized bodies (413).
"""

from __future__ import annotations

import re
from typing import Final

from quart import Response, request
from quart.wrappers.response import DataBody
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ...api import EngineAPI
from ...errors import ShuttingDown
from ...replica import replica_id
from ...settings import Settings
from ..auth import Scope
from ..exchange import Exchange, Recorder
from ..httphost.door import UNTIMED_RECEIVE_KEY
from ..httphost.openapi import OpenApiPart
from ..httphost.replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend
from ..receive import too_large
from .asgi import RawRoutes, gzip_if_wanted, reply_for, send_reply
from .management_routes import MANAGEMENT_PREFIX, ManagementViews, register_management
from .management_routes import auth_scope as management_scope
from .openapi import openapi_part
from .sequence_headers import naming_for
from .sse import END_FRAME, error_frame
from .views import RestViews, http_error_reply, response
from .wire import GZIP_HEADERS, json_bytes, method_not_allowed_reply, too_large_reply

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


class OipRest:
    """The OIP's REST door: every path the other doors do not claim (list it last: it
    answers unknown paths 404 in its shape).

    ``infer``, ``generate`` and the streams take the raw path (``infer`` only when
    ``fast_path``; otherwise a Quart view serves it, for comparisons); everything else
    goes through ``quart``. ``recorder`` is the host's (a stream's response timings)."""

    def __init__(
        self,
        engine: EngineAPI,
        settings: Settings,
        quart: QuartTrio,
        recorder: Recorder,
        *,
        fast_path: bool = True,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.quart = quart
        self.lifespan: ASGIApp | None = quart  # type: ignore[assignment]  # Quart's startup and shutdown
        self.fast_path = fast_path
        naming = naming_for(settings.sequence_headers, replica_id(settings.replica_id))
        self.raw = RawRoutes(engine, settings.max_body_bytes, settings.gzip_min_bytes, recorder, naming)

    @staticmethod
    def claims(path: str) -> bool:
        return True

    @staticmethod
    def auth_scope(path: str) -> Scope | None:
        """A model's infer / generate (on the raw path or Quart's) is inference; the
        management paths are management (:func:`.management.auth_scope`)."""
        if _MODEL_OP.fullmatch(path) is not None:
            return Scope.INFERENCE
        return management_scope(path)

    @staticmethod
    def openapi() -> OpenApiPart:
        """The OIP's ``/v2`` paths (:mod:`.openapi`)."""
        return openapi_part()

    @staticmethod
    def bad_target(why: str) -> tuple[int, bytes]:
        return 400, json_bytes({"error": why})

    @staticmethod
    def forbidden(why: str) -> tuple[int, bytes]:
        return 403, json_bytes({"error": why})

    @staticmethod
    def shutting_down(message: str) -> tuple[int, bytes]:
        return 503, json_bytes({"error": message})

    @staticmethod
    def stream_end(method: str, path: str, message: str) -> bytes:
        """A last ``event: error`` with the OIP error body, and ``event: end`` on
        ``GET .../generate_stream`` (which always ends with it)."""
        tail = error_frame(ShuttingDown(message))
        if method == "GET" and path.endswith("/generate_stream"):
            tail += END_FRAME
        return tail

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange) -> None:
        path: str = scope["path"]
        match = _MODEL_OP.fullmatch(path)
        if match is not None and (self.fast_path or match[3] != "infer"):
            op = match[3]
            allowed = _RAW_METHODS[op]
            exchange.model_request(match[1], match[2])
            if scope["method"] in allowed:
                await self.raw.serve(op, scope, receive, send, match[1], match[2], exchange)
            else:
                await send_reply(send, method_not_allowed_reply(scope["method"], path, allowed))
        elif too_large(scope, self.settings.max_body_bytes):  # refused unread, read or not
            await send_reply(send, too_large_reply(self.settings.max_body_bytes))
        else:
            if match is not None:
                exchange.model_request(match[1], match[2])
                scope = {
                    **scope,
                    "extensions": {**(scope.get("extensions") or {}), "actorserve": exchange},
                }
            elif path.startswith(MANAGEMENT_PREFIX):  # for the access line
                exchange.model = path[len(MANAGEMENT_PREFIX) :].split("/", 1)[0]
            await self.quart(scope, scope[UNTIMED_RECEIVE_KEY], send)  # type: ignore[arg-type]


_QUART_MODEL_ROUTES: Final = (
    ("", "model_metadata", ("GET",)),
    ("/ready", "model_ready", ("GET",)),
    ("/infer", "infer", ("POST",)),  # reached only when the raw path is off
    ("/config", "model_config", ("GET",)),
    ("/stats", "model_stats", ("GET",)),
)


def create_door(
    engine: EngineAPI, settings: Settings, recorder: Recorder, *, fast_path: bool = True
) -> OipRest:
    """The OIP's REST door on ``engine``. ``POST /v2/repository/models/{name}/load``
    calls ``engine.load_from_repository``. ``fast_path=False`` sends ``infer`` through
    Quart too (for comparison). ``recorder``: the HTTP host's."""
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
    return OipRest(engine, settings, app, recorder, fast_path=fast_path)
