"""The management routes over REST: the OIP repository extension's load and unload
(Triton's and MLServer's shape) and actorserve's own routes under
``/v2/repository/models/{name}/...`` (describe, workers, default version).

:func:`register_management` registers every one of them, and only them; every path under
:data:`MANAGEMENT_PREFIX` is management (:func:`auth_scope`, routed or not), which the
app's guard checks before routing (:mod:`actorserve.transport.auth`). Views call only
:class:`~actorserve.api.EngineAPI` and raise domain errors (the app's error handler
answers them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from ...api import EngineAPI, ModelDescription, bool_parameter
from ...errors import BadInput
from ...settings import Settings
from ..auth import Scope
from ..triton import UNLOAD_DEPENDENTS_NOTE, load_config
from .views import response
from .wire import decompress_body, json_reply, loads

log = logging.getLogger(__name__)

View = Callable[..., Awaitable[Response]]

#: REST paths under this prefix are management routes, and only they are.
MANAGEMENT_PREFIX: Final = "/v2/repository/models/"

#: (rule, endpoint, methods) of every management route; ``<version>`` rules come twice.
MANAGEMENT_ROUTES: Final = (
    ("/v2/repository/models/<name>/load", "load", ("POST",)),
    ("/v2/repository/models/<name>/unload", "unload", ("POST",)),
    ("/v2/repository/models/<name>", "describe", ("GET",)),
    ("/v2/repository/models/<name>/versions/<version>", "describe", ("GET",)),
    ("/v2/repository/models/<name>/workers", "workers", ("POST",)),
    ("/v2/repository/models/<name>/versions/<version>/workers", "workers", ("POST",)),
    ("/v2/repository/models/<name>/default_version", "default_version", ("POST",)),
)


def auth_scope(path: str) -> Scope | None:
    """Management for every path under :data:`MANAGEMENT_PREFIX` (those added later
    included), None for the others."""
    return Scope.MANAGEMENT if path.startswith(MANAGEMENT_PREFIX) else None


def description_json(description: ModelDescription) -> dict[str, Any]:
    return attrs.asdict(description)  # tuples: JSON arrays


class ManagementViews:
    """The views of :data:`MANAGEMENT_ROUTES` over one engine."""

    def __init__(self, engine: EngineAPI, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    async def _object(self) -> dict[str, Any]:
        """The JSON object of the body ({} for none); :class:`BadInput` otherwise."""
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        encoding = request.headers.get("Content-Encoding")
        if encoding is not None:  # inflating up to max_body_bytes takes a while: off the event loop
            body = await trio.to_thread.run_sync(
                decompress_body, body, encoding, self.settings.max_body_bytes
            )
        if not body.strip():
            return {}
        obj = loads(body)
        if not isinstance(obj, dict):
            raise BadInput("the request body must be a JSON object")
        return obj

    async def _parameters(self) -> dict[str, Any]:
        parameters = (await self._object()).get("parameters") or {}
        if not isinstance(parameters, dict):
            raise BadInput("'parameters' must be a JSON object")
        return parameters

    async def load(self, name: str) -> Response:
        config = load_config(await self._parameters())
        await self.engine.load_from_repository(name, config)
        return response(json_reply({}))

    async def unload(self, name: str) -> Response:
        parameters = await self._parameters()
        if bool_parameter(parameters.get("unload_dependents", False), "unload_dependents"):
            log.info("unload %s: %s", name, UNLOAD_DEPENDENTS_NOTE)
        await self.engine.unload(name, grace=self.settings.grace_period)
        return response(json_reply({}))

    async def describe(self, name: str, version: str | None = None) -> Response:
        return response(json_reply(description_json(await self.engine.describe(name, version))))

    async def workers(self, name: str, version: str | None = None) -> Response:
        body = await self._object()
        workers = body.get("workers")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise BadInput(f"'workers' must be an integer >= 1, got {workers!r}")
        grace = body.get("grace_period")
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0
        ):
            raise BadInput(f"'grace_period' must be a number of seconds >= 0, got {grace!r}")
        await self.engine.set_workers(name, workers, version, grace=grace)
        return response(json_reply(description_json(await self.engine.describe(name, version))))

    async def default_version(self, name: str) -> Response:
        version = (await self._object()).get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            version = str(version)
        if not isinstance(version, str) or not version:
            raise BadInput(f"'version' must be a model version, got {version!r}")
        await self.engine.set_default_version(name, version)
        return response(json_reply(description_json(await self.engine.describe(name))))


def register_management(app: QuartTrio, views: ManagementViews) -> None:
    """Register every management route on ``app``."""
    for rule, endpoint, methods in MANAGEMENT_ROUTES:
        view: View = getattr(views, endpoint)
        app.add_url_rule(rule, f"management_{endpoint}_{rule.count('<')}", view, methods=list(methods))
