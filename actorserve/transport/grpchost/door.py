"""What a gRPC door declares to the gRPC host: its methods and the scope of each.

A door (Triton's ``inference.GRPCInferenceService`` with ``actorserve.v1.Management``,
TorchServe's two services) is one package; the host (:mod:`.host`, :mod:`.server`) owns
what every call shares: the listening sockets, HTTP/2 (grpclib), the token check, the
call's :class:`~actorserve.transport.exchange.Exchange` (metrics and the access log),
and the drain. A door never imports another door, and the host imports none: the
server (:mod:`actorserve.server.doors`) lists the doors and hands them to the host.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio
from grpclib.const import Handler
from grpclib.server import Stream

from ..auth import Scope
from ..exchange import Recorder

#: a grpclib handler function
Method = Callable[[Stream[Any, Any]], Awaitable[None]]


class Calls(Protocol):
    """What a door borrows from the gRPC host for its handlers."""

    #: refusing new calls (asyncio side; a readiness RPC answers ``false`` then)
    draining: bool
    #: set (on the trio side) when draining starts: a stream stops reading then
    drain_started: trio.Event
    #: metrics and the access log (a stream records each of its responses)
    recorder: Recorder

    def tracked(self, func: Method) -> Method:
        """``func`` counted while it runs, refused while draining, ended with
        UNAVAILABLE when the grace period is over: wrap every method that works."""
        ...


class GrpcDoor(Protocol):
    """One gRPC door: the handlers of the services it owns (full method paths,
    ``/package.Service/Method``), and the auth scope of each of its methods."""

    def handlers(self, calls: Calls) -> Mapping[str, Handler]:
        """Every method this door serves, built once when the host starts."""
        ...

    def auth_scope(self, method: str) -> Scope | None:
        """The scope of ``method`` (one of this door's paths): management, inference,
        or None (open). Classify by service and prefix, so a method added later under
        the same prefix is covered."""
        ...


__all__ = ["Calls", "GrpcDoor", "Method"]
