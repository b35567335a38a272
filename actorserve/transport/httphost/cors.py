"""CORS for browser apps on other origins (``--cors-allow-origin``), at the ASGI level so
it covers the raw paths (infer, the streams) and Quart alike.

A request whose ``Origin`` is allowed gets ``Access-Control-Allow-Origin`` (and
``Vary: Origin``) on its response, streaming or not; a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) from an allowed origin is answered 204 here, from
any other origin 403. Requests without ``Origin`` pass untouched (no cost for
non-browser clients). No I/O of its own.

A browser sends some cross-origin requests without a preflight (a "simple request": a
``text/plain`` POST), so CORS alone would let any web page make the server work, only
not read the answer. :func:`foreign_origin` therefore names a request whose ``Origin``
is neither this server's own (the scheme and ``Host`` it was reached by) nor allowed,
and the host refuses it 403 before its body is read, whether CORS is on or not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from .replies import ASGIScope, ASGISend, Reply, json_reply

ALLOWED_METHODS: Final = "GET, POST, OPTIONS"
#: request headers a browser may send (the ones the OIP and Triton clients use)
ALLOWED_HEADERS: Final = (
    "Content-Type, Content-Encoding, Accept, Accept-Encoding, Authorization, Inference-Header-Content-Length, "
    "Sequence-Id, Sequence-Start, Sequence-End, Last-Event-ID"
)
#: response headers a page may read
EXPOSED_HEADERS: Final = (
    b"Inference-Header-Content-Length, Sequence-Id, Content-Encoding, Retry-After, Actorserve-Replica"
)
PREFLIGHT_MAX_AGE: Final = "600"


def _header(scope: ASGIScope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def own_origin(scope: ASGIScope) -> str | None:
    """The origin a page served by this server has: ``scheme://host[:port]`` as the
    request reached it (``X-Forwarded-Proto`` says the scheme behind a TLS proxy; a
    browser cannot send that header without a preflight), lower case; None without a
    ``Host``."""
    host = _header(scope, b"host")
    if not host:
        return None
    scheme = _header(scope, b"x-forwarded-proto") or scope.get("scheme") or "http"
    return f"{scheme.split(',')[0].strip()}://{host.strip()}".lower()


def foreign_origin(scope: ASGIScope, cors: Cors | None) -> str | None:
    """The request's ``Origin`` if it is there and is neither this server's own
    (:func:`own_origin`) nor allowed by ``cors`` (``--cors-allow-origin``); else None.
    An opaque origin (``null``: a sandboxed page, a ``file:`` URL) is never own."""
    origin = _header(scope, b"origin")
    if origin is None:
        return None
    if cors is not None and cors.allowed(scope)[1]:
        return None
    if origin.lower() == own_origin(scope):
        return None
    return origin


def refusal_text(origin: str) -> str:
    """What a refused origin is told (the origin shown at most 200 characters long)."""
    shown = origin if len(origin) <= 200 else origin[:200] + "..."
    return f"origin {shown!r} may not use this server: it is not the server's own and not allowed (--cors-allow-origin)"


class Cors:
    """The allowed origins (``*``: any) and what to add for them."""

    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = frozenset(origins)
        self.any = "*" in self.origins

    def allowed(self, scope: ASGIScope) -> tuple[str | None, bool]:
        """(the request's Origin or None, whether it is allowed)."""
        origin = _header(scope, b"origin")
        if origin is None:
            return None, False
        return origin, self.any or origin in self.origins

    @staticmethod
    def is_preflight(scope: ASGIScope) -> bool:
        return scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None

    def preflight(self, scope: ASGIScope, origin: str, allowed: bool) -> Reply:
        if not allowed:
            return json_reply({"error": f"origin {origin!r} is not allowed (--cors-allow-origin)"}, 403)
        requested = _header(scope, b"access-control-request-headers")
        return Reply(
            204,
            [
                ("Access-Control-Allow-Origin", "*" if self.any else origin),
                ("Access-Control-Allow-Methods", ALLOWED_METHODS),
                ("Access-Control-Allow-Headers", requested or ALLOWED_HEADERS),
                ("Access-Control-Max-Age", PREFLIGHT_MAX_AGE),
                ("Vary", "Origin"),
            ],
            b"",
        )

    def wrap(self, send: ASGISend, origin: str) -> ASGISend:
        """``send`` adding the CORS headers to the response's start."""
        added = [
            (b"access-control-allow-origin", b"*" if self.any else origin.encode("latin-1")),
            (b"access-control-expose-headers", EXPOSED_HEADERS),
            (b"vary", b"Origin"),
        ]

        async def send_with_cors(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *added]}
            await send(message)

        return send_with_cors
