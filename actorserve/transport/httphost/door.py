"""What an HTTP door declares to the HTTP host (:class:`HttpDoor`).

A door (the OIP's REST API, the OpenAI API, TorchServe's REST APIs, the playground) is
one package; it owns its paths and its wire shapes. The host (:mod:`.host`) owns what
every request shares: reading the target, CORS, the token check, the request's
:class:`~actorserve.transport.exchange.Exchange` (metrics and the access log), the drain
and its 503, ``/metrics`` and the OpenAPI document the doors' parts make up. A door never imports another door, and the host imports
none: the server (:mod:`actorserve.server.doors`) lists the doors and hands them to the host.
"""

from __future__ import annotations

from typing import Final, Protocol

from ..auth import Scope
from ..exchange import Exchange
from .openapi import OpenApiPart
from .replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend

#: the scope key under which the host leaves the request's ``receive`` without the
#: host's body deadline, for a framework that times its own body reads (Quart)
UNTIMED_RECEIVE_KEY: Final = "actorserve.untimed_receive"


class HttpDoor(Protocol):
    """One HTTP door. The host asks the doors in the server's order and gives a request
    to the first that :meth:`claims` its path (list a door that claims every path last:
    it answers what no other door serves, 404 included)."""

    #: a lifespan handler (startup, shutdown) the door's framework needs, or None
    lifespan: ASGIApp | None

    def claims(self, path: str) -> bool:
        """This door serves ``path`` (the one canonical path the host read), or answers
        it with its own 404 / 405."""
        ...

    def auth_scope(self, path: str) -> Scope | None:
        """The scope of ``path`` (a path this door claims), as :meth:`serve` routes it:
        management, inference, or None (open)."""
        ...

    def openapi(self) -> OpenApiPart:
        """The door's part of the port's OpenAPI document: every path it serves (the host
        checks each one is claimed by the door that documents it; see
        :mod:`.openapi` for the kit). A door with no API to document returns an empty part."""
        ...

    def bad_target(self, why: str) -> tuple[int, bytes]:
        """The 400 status and JSON body, in this door's error shape, of a request whose
        target the host refused (``why`` says what is wrong with it)."""
        ...

    def forbidden(self, why: str) -> tuple[int, bytes]:
        """The 403 status and JSON body, in this door's error shape, of a request the host
        refused unread (``why``: a browser's ``Origin`` this server does not allow)."""
        ...

    def shutting_down(self, message: str) -> tuple[int, bytes]:
        """The status (503) and JSON body, in this door's error shape, of a request the
        drain refuses or ends before its response started."""
        ...

    def stream_end(self, method: str, path: str, message: str) -> bytes:
        """The last chunk of an event stream of this door that the end of the grace
        period cuts short (``message``: why), in the door's event shape."""
        ...

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange) -> None:
        """Answer the request. ``receive`` is timed by ``read_timeout``; ``exchange`` is
        the request's record, which the host finishes: a request that runs a model says
        so with ``exchange.model_request(model, version)`` (its metrics labels) as soon
        as it knows the model."""
        ...


__all__ = ["UNTIMED_RECEIVE_KEY", "HttpDoor"]
