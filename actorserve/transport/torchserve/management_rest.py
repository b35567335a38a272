"""TorchServe's management REST paths, as raw ASGI, in one place (so they can be put
behind a management token or served on a port of their own as a whole):

``GET /models`` (``limit``, ``next_page_token``), ``POST /models?url=...``,
``GET /models/{m}[/{v}|/all]``, ``PUT /models/{m}[/{v}]?min_worker=&max_worker=``,
``PUT /models/{m}/{v}/set-default``, ``DELETE /models/{m}[/{v}]``; and which paths a port
of TorchServe's management alone serves (:func:`on_management_port`).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from ...api import EngineAPI
from ..auth import Scope
from ..httphost.replies import ASGIReceive, ASGIScope, ASGISend
from .errors import TsError, ts_error
from .management_ops import Management, Reply, _int_option
from .rest import send_error, send_json


def _owned(path: str) -> bool:
    return path == "/models" or path.startswith("/models/")


def on_management_port(path: str) -> bool:
    """A path served on TorchServe's management port (``--ts-management-http-port``):
    the management paths, and ``/ping`` for load balancers' health checks."""
    return path == "/ping" or _owned(path)


async def not_on_management_port(send: ASGISend) -> None:
    """TorchServe's answer to a path it does not serve."""
    message = "Requested resource is not found, please refer to API document."
    await send_error(send, TsError(404, "ResourceNotFoundException", message))


class TorchServeManagement:
    """The management routes; :meth:`serve` answers a request to one of them (True) or
    leaves it to the next router (False)."""

    def __init__(self, engine: EngineAPI) -> None:
        self.management = Management(engine)

    @staticmethod
    def auth_scope(path: str) -> Scope | None:
        """Every path :meth:`serve` owns is management (routed or not)."""
        return Scope.MANAGEMENT if _owned(path) else None

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> bool:
        path: str = scope["path"]
        if not _owned(path):
            return False
        # the path is percent-decoded once already (the ASGI scope's): decoding it again
        # would turn ``%252F`` into a ``/`` inside a name
        parts = path.strip("/").split("/")[1:]
        method: str = scope["method"]
        options = dict(
            parse_qsl(scope.get("query_string", b"").decode("utf-8", "replace"), keep_blank_values=True)
        )
        try:
            reply = await self._route(method, parts, options)
        except Exception as exc:
            await send_error(send, ts_error(exc))
            return True
        if reply is None:
            await send_error(
                send, TsError(405, "MethodNotAllowedException", f"{method} {path} is not allowed")
            )
        else:
            await send_json(send, reply.code, reply.json())
        return True

    async def _route(self, method: str, parts: list[str], options: dict[str, str]) -> Reply | None:
        manage = self.management
        if not parts:
            if method == "GET":
                return await manage.list_models(
                    _int_option(options, "limit"), _int_option(options, "next_page_token")
                )
            if method == "POST":
                return await manage.register(options)
            return None
        name = parts[0]
        version = parts[1] if len(parts) > 1 else None
        if len(parts) == 3 and parts[2] == "set-default" and method == "PUT":
            assert version is not None
            return await manage.set_default(name, version)
        if len(parts) > 2:
            return None
        if method == "GET":
            return await manage.describe(name, version)
        if method == "PUT":
            return await manage.scale(name, version, options)
        if method == "DELETE":
            return await manage.unregister(name, version)
        return None
