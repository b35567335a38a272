"""The browser playground: ``GET /`` (one static page) and its script and style under
``/playground/``.

Four small files in this package, read once when the routes are registered and served
from memory; nothing is fetched from elsewhere. The page talks to the server only
through the public API (``/v2/repository/index``, model metadata and the request
parameters it declares, ``generate_stream`` over ``EventSource``, ``infer_stream`` for a
raw request, the OpenAI chat API, and ``infer`` to cancel a sequence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from quart import Quart, Response

__all__ = ["FILES", "register_playground"]

_HERE: Final = Path(__file__).resolve().parent

#: URL path -> (file in this package, content type)
FILES: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/playground/models.js": ("models.js", "text/javascript; charset=utf-8"),
    "/playground/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    "/playground/playground.css": ("playground.css", "text/css; charset=utf-8"),
}


def register_playground(app: Quart) -> None:
    """Add ``GET`` routes for the playground's files to ``app``."""
    for path, (filename, content_type) in FILES.items():
        body = (_HERE / filename).read_bytes()
        headers = {"Content-Type": content_type, "Cache-Control": "no-cache"}

        async def view(body: bytes = body, headers: dict[str, str] = headers) -> Response:
            return Response(body, status=200, headers=headers)

        app.add_url_rule(path, f"playground:{filename}", view, methods=["GET"])
