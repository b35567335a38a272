"""TorchServe's REST door: its inference paths (``/ping``, ``/predictions/...``,
``/explanations/...``, :mod:`.rest`) and its management paths (``/models...``,
:mod:`.management_rest`), on the main REST port; or, with ``management_port``, the
management paths and ``/ping`` alone on a port of their own (everything else is
TorchServe's 404 there). Errors are TorchServe's JSON: ``{"code", "type", "message"}``.
"""

from __future__ import annotations

from typing import Final

import orjson

from ...api import EngineAPI
from ...errors import ShuttingDown
from ..auth import Scope
from ..exchange import Exchange
from ..httphost.openapi import OpenApiPart
from ..httphost.replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend
from ..receive import too_large
from .errors import TsError, ts_error
from .management_rest import TorchServeManagement, not_on_management_port, on_management_port
from .openapi import openapi_part
from .rest import TorchServeInference, send_error, send_json

_INFERENCE_PREFIXES: Final = ("/predictions/", "/explanations/")


def _torchserve_path(path: str) -> bool:
    return on_management_port(path) or path.startswith(_INFERENCE_PREFIXES)


class TorchServeRest:
    """The door; ``limit`` is ``max_body_bytes`` (a body announced over it is refused
    413, unread)."""

    lifespan: ASGIApp | None = None

    def __init__(self, engine: EngineAPI, limit: int, *, management_port: bool = False) -> None:
        self.limit = limit
        self.management_port = management_port
        #: the inference paths (/ping, /predictions, /explanations)
        self.inference = TorchServeInference(engine, limit)
        #: the management paths (/models...), kept apart: they are management
        self.management = TorchServeManagement(engine)

    def claims(self, path: str) -> bool:
        return self.management_port or _torchserve_path(path)

    def auth_scope(self, path: str) -> Scope | None:
        if self.management_port and not on_management_port(path):
            return None  # answered 404 unread
        return self.inference.auth_scope(path) or self.management.auth_scope(path)

    @staticmethod
    def openapi() -> OpenApiPart:
        """TorchServe's paths (:mod:`.openapi`), on either port."""
        return openapi_part()

    @staticmethod
    def bad_target(why: str) -> tuple[int, bytes]:
        return _shaped(TsError(400, "BadRequestException", why))

    @staticmethod
    def forbidden(why: str) -> tuple[int, bytes]:
        return _shaped(TsError(403, "ForbiddenException", why))

    def shutting_down(self, message: str) -> tuple[int, bytes]:
        return _shaped(ts_error(ShuttingDown(message)))

    @staticmethod
    def stream_end(method: str, path: str, message: str) -> bytes:
        return b""  # its streams are chunked bodies: the terminating chunk ends them

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange) -> None:
        path: str = scope["path"]
        if self.management_port and not on_management_port(path):
            await not_on_management_port(send)
        elif too_large(scope, self.limit):  # refused unread, read or not
            message = f"request body is over {self.limit} bytes (max_body_bytes)"
            await send_error(send, TsError(413, "RequestTooLargeException", message))
        elif await self.inference.serve(scope, receive, send, exchange):
            pass
        elif await self.management.serve(scope, receive, send):
            pass
        else:  # under TorchServe's prefixes, but none of its routes
            body = orjson.dumps({"error": f"no such endpoint: {scope['method']} {path}"})
            await send_json(send, 404, body)


def _shaped(error: TsError) -> tuple[int, bytes]:
    return error.code, error.json()


__all__ = ["TorchServeRest"]
