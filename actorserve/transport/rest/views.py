"""The Quart views of the endpoints off the hot path: health, server and model
metadata, readiness, Triton's model config and statistics, the repository index, and
``infer`` when the raw path is turned off (for comparisons). The management routes
(load, unload, workers, ...) are in :mod:`.management_routes`.

Views call only :class:`~actorserve.api.EngineAPI` and raise domain errors; the error
handler registered in :mod:`.app` turns them into JSON with the table's status.
"""

from __future__ import annotations

from typing import Any

import trio
from quart import Response, request
from werkzeug.datastructures import Headers as WerkzeugHeaders
from werkzeug.exceptions import HTTPException

from ...api import EngineAPI, ModelMetadata, ModelState, TensorMetadata, bool_parameter
from ...errors import BadInput, ModelNotReady
from ...replica import replica_id
from ...settings import Settings
from ...version import __version__
from ..exchange import Exchange
from ..triton import EXTENSIONS, config_json, statistics_json
from .asgi import infer_reply
from .sequence_headers import naming_for
from .wire import (
    HttpReply,
    RequestHeaders,
    decompress_body,
    error_reply,
    json_reply,
    loads,
    too_large_reply,
)


def response(reply: HttpReply) -> Response:
    return Response(reply.body, status=reply.status, headers=WerkzeugHeaders(reply.headers))


def http_error_reply(error: HTTPException, max_body_bytes: int) -> HttpReply:
    """A werkzeug/Quart HTTP error (404 route, 405, 413, 408...) as JSON."""
    status = error.code or 500
    if status == 413:
        return too_large_reply(max_body_bytes)
    if status == 404:
        message = f"no such endpoint: {request.method} {request.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.path}"
    else:
        message = error.description or error.name
    headers = [(k, v) for k, v in error.get_headers() if k.lower() == "allow"]
    return json_reply({"error": message}, status, headers)


def _tensors(specs: tuple[TensorMetadata, ...]) -> list[dict[str, Any]]:
    return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]


def metadata_json(meta: ModelMetadata) -> dict[str, Any]:
    """OIP model metadata as ``GET /v2/models/{name}`` answers it."""
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": _tensors(meta.inputs),
        "outputs": _tensors(meta.outputs),
        **({"parameters": dict(meta.parameters)} if meta.parameters else {}),
    }


class RestViews:
    """The Quart views over one engine (see ``docs/rest.md`` for each endpoint)."""

    def __init__(self, engine: EngineAPI, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    async def _body(self) -> bytes:
        """The request body, inflated; :class:`~.wire.BodyTooLarge` past the limit."""
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        encoding = request.headers.get("Content-Encoding")
        if encoding is None:
            return body
        # inflating up to max_body_bytes takes a while: off the event loop
        return await trio.to_thread.run_sync(decompress_body, body, encoding, self.settings.max_body_bytes)

    async def live(self) -> Response:
        return response(json_reply({"live": True}))

    async def ready(self) -> Response:
        if await self.engine.ready():
            return response(json_reply({"ready": True}))
        infos = await self.engine.models()
        loading = [f"{m.name}:{m.version}" for m in infos if m.state is ModelState.LOADING]
        unloading = [
            f"{m.name}:{m.version}" for m in infos if not m.ready and m.state is not ModelState.LOADING
        ]
        if loading:
            why = f"not ready: {', '.join(loading)}"
        elif unloading and len(unloading) < len(infos):  # one model is being unloaded
            why = f"not ready: {', '.join(unloading)} (unloading)"
        else:  # every model stopping (or none left): the engine is closing
            why = "the server is shutting down"
        return response(error_reply(ModelNotReady(why)))

    async def server_metadata(self) -> Response:
        return response(
            json_reply({"name": "actorserve", "version": __version__, "extensions": list(EXTENSIONS)})
        )

    async def model_metadata(self, name: str, version: str | None = None) -> Response:
        return response(json_reply(metadata_json(await self.engine.metadata(name, version))))

    async def model_ready(self, name: str, version: str | None = None) -> Response:
        info = await self.engine.model_info(name, version)
        if not info.ready:
            raise ModelNotReady(
                f"model {name!r} version {info.version!r} is not ready ({info.state.lower()})"
            )
        return response(json_reply({"name": info.name, "version": info.version, "ready": True}))

    async def repository_index(self) -> Response:
        ready_only = False
        if request.method == "POST":
            body = await self._body()
            if body.strip():
                obj = loads(body)
                if not isinstance(obj, dict):
                    raise BadInput("the repository index request must be a JSON object")
                ready_only = bool_parameter(obj.get("ready", False), "ready")
        index = [
            {"name": e.name, "version": e.version, "state": str(e.state), "reason": e.reason}
            for e in await self.engine.repository_index()
            if not ready_only or e.state is ModelState.READY
        ]
        return response(json_reply(index))

    async def model_config(self, name: str, version: str | None = None) -> Response:
        description = await self.engine.describe(name, version)
        metadata = await self.engine.metadata(name, version)
        return response(json_reply(config_json(description, metadata)))

    async def model_stats(self, name: str = "", version: str | None = None) -> Response:
        return response(json_reply(statistics_json(await self.engine.inference_statistics(name, version))))

    async def infer(self, name: str, version: str | None = None) -> Response:
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        naming = naming_for(self.settings.sequence_headers, replica_id(self.settings.replica_id))
        headers = RequestHeaders.from_lookup(request.headers.get, naming)
        extensions: Any = request.scope.get("extensions") or {}
        exchange: Exchange | None = extensions.get("actorserve")  # set by OipRest (the door)
        limit = self.settings.max_body_bytes
        return response(await infer_reply(self.engine, name, version, body, headers, limit, exchange))
