"""The ASGI application handed to hypercorn: the raw paths of :mod:`.asgi` first
(``infer``, ``generate`` and every stream), the OpenAI API under ``/v1/``
(:mod:`actorserve.transport.openai`), Quart (:mod:`.views`) for the rest.

Every error a client sees is ``{"error": "<message>"}`` JSON with a meaningful status,
including unknown routes (404), wrong methods (405) and oversized bodies (413).
"""

from __future__ import annotations

import re
from typing import Final

from quart import Response, request
from quart.wrappers.response import DataBody
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ...api import EngineAPI
from ...settings import Settings
from ..openai import OpenAIRoutes
from ..playground import register_playground
from ..torchserve import TorchServeInference, TorchServeManagement
from .asgi import ASGIReceive, ASGIScope, ASGISend, RawRoutes, gzip_if_wanted, reply_for, send_reply
from .cors import Cors
from .management import ManagementViews, register_management
from .views import RestViews, http_error_reply, response
from .wire import GZIP_HEADERS, method_not_allowed_reply

#: ``/v2/models/{name}[/versions/{version}]/{op}`` for the operations on the raw path.
_MODEL_OP: Final = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/(infer|infer_stream|generate|generate_stream)")

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

    def __init__(self, engine: EngineAPI, settings: Settings, quart: QuartTrio, *, fast_path: bool = True) -> None:
        self.engine = engine
        self.settings = settings
        self.quart = quart
        self.fast_path = fast_path
        self.raw = RawRoutes(engine, settings.max_body_bytes, settings.gzip_min_bytes)
        self.cors = Cors(settings.cors_allow_origin) if settings.cors_allow_origin else None
        self.openai = OpenAIRoutes(engine, settings.max_body_bytes)
        #: TorchServe's inference paths (/ping, /predictions, /explanations)
        self.torchserve = TorchServeInference(engine, settings.max_body_bytes)
        #: TorchServe's management paths (/models...), kept apart: they are management
        self.torchserve_management = TorchServeManagement(engine)

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "http":
            if self.cors is not None:
                origin, origin_ok = self.cors.allowed(scope)
                if origin is not None:
                    if self.cors.is_preflight(scope):
                        await send_reply(send, self.cors.preflight(scope, origin, origin_ok))
                        return
                    if origin_ok:
                        send = self.cors.wrap(send, origin)
            if scope["path"].startswith("/v1/"):
                await self.openai(scope, receive, send)
                return
            match = _MODEL_OP.fullmatch(scope["path"])
            if match is not None and (self.fast_path or match[3] != "infer"):
                op = match[3]
                allowed = _RAW_METHODS[op]
                if scope["method"] in allowed:
                    await self.raw.serve(op, scope, receive, send, match[1], match[2])
                else:
                    await send_reply(send, method_not_allowed_reply(scope["method"], scope["path"], allowed))
                return
            if await self.torchserve.serve(scope, receive, send):
                return
            if await self.torchserve_management.serve(scope, receive, send):
                return
        await self.quart(scope, receive, send)  # type: ignore[arg-type]


_QUART_MODEL_ROUTES: Final = (
    ("", "model_metadata", ("GET",)),
    ("/ready", "model_ready", ("GET",)),
    ("/infer", "infer", ("POST",)),  # reached only when the raw path is off
    ("/config", "model_config", ("GET",)),
    ("/stats", "model_stats", ("GET",)),
)


def create_app(engine: EngineAPI, settings: Settings, *, fast_path: bool = True) -> RestApp:
    """The ASGI application serving ``engine``. ``POST /v2/repository/models/{name}/load``
    calls ``engine.load_from_repository``. ``fast_path=False`` sends ``infer`` through
    Quart too (for comparison)."""
    views = RestViews(engine, settings)
    app = QuartTrio("actorserve")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
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
    # management.py; an auth check wraps them there.
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
    register_playground(app)
    return RestApp(engine, settings, app, fast_path=fast_path)
