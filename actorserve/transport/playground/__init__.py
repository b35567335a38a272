"""The browser playground's door: ``GET /`` (one static page) and its script and style
under ``/playground/``.

Four small files in this package, read (and gzipped) once when the door is built and
served from memory; nothing is fetched from elsewhere. The page talks to the server only
through the public API (``/v2/repository/index``, model metadata and the request
parameters it declares, ``generate_stream`` over ``EventSource``, ``infer_stream`` for a
raw request, the OpenAI chat API, and ``infer`` to cancel a sequence). Its paths are
open (no token) and answer errors as ``{"error": message}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import orjson

from .. import compression
from ..auth import Scope
from ..exchange import Exchange
from ..httphost.openapi import OpenApiPart
from ..httphost.replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend, Reply, json_reply, send_reply
from ..receive import too_large

__all__ = ["FILES", "Playground"]

_HERE: Final = Path(__file__).resolve().parent

#: URL path -> (file in this package, content type)
FILES: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/playground/models.js": ("models.js", "text/javascript; charset=utf-8"),
    "/playground/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    "/playground/playground.css": ("playground.css", "text/css; charset=utf-8"),
}
_ALLOWED: Final = ("GET", "HEAD")


class Playground:
    """The door. ``gzip_min_bytes``: a file larger is sent gzipped to a client that
    accepts it (as every complete reply of the server); a request announcing a body over
    ``max_body_bytes`` is refused 413 unread."""

    lifespan: ASGIApp | None = None

    def __init__(self, gzip_min_bytes: int, max_body_bytes: int) -> None:
        self.limit = max_body_bytes
        self._files: dict[str, tuple[bytes, bytes | None, str]] = {}
        for path, (filename, content_type) in FILES.items():
            body = (_HERE / filename).read_bytes()
            packed = compression.compress(body, "gzip") if len(body) > gzip_min_bytes else None
            self._files[path] = (body, packed, content_type)

    @staticmethod
    def claims(path: str) -> bool:
        return path in FILES

    @staticmethod
    def auth_scope(path: str) -> Scope | None:
        return None

    @staticmethod
    def openapi() -> OpenApiPart:
        """Nothing: the page and its files are a browser's, not an API."""
        return OpenApiPart({})

    @staticmethod
    def bad_target(why: str) -> tuple[int, bytes]:
        return 400, orjson.dumps({"error": why})

    @staticmethod
    def forbidden(why: str) -> tuple[int, bytes]:
        return 403, orjson.dumps({"error": why})

    @staticmethod
    def shutting_down(message: str) -> tuple[int, bytes]:
        return 503, orjson.dumps({"error": message})

    @staticmethod
    def stream_end(method: str, path: str, message: str) -> bytes:
        return b""  # no event streams here

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        if too_large(scope, self.limit):
            error = {"error": f"the request body is larger than {self.limit} bytes (max_body_bytes)"}
            await send_reply(send, json_reply(error, 413))
            return
        if method not in _ALLOWED:
            error = {"error": f"method {method} is not allowed on {path}"}
            await send_reply(send, json_reply(error, 405, [("Allow", ", ".join(_ALLOWED))]))
            return
        body, packed, content_type = self._files[path]
        headers = [("Content-Type", content_type), ("Cache-Control", "no-cache")]
        if packed is not None and compression.accepts(_header(scope, b"accept-encoding")):
            body = packed
            headers += [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
        if method == "HEAD":  # the headers of the GET, no body
            headers.append(("Content-Length", str(len(body))))
            await send({"type": "http.response.start", "status": 200, "headers": _raw(headers)})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send_reply(send, Reply(200, headers, body))


def _header(scope: ASGIScope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _raw(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
