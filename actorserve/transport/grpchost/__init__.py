"""The gRPC host: what every gRPC call of every door shares, on grpclib.

grpclib runs on asyncio only, so this package holds actorserve's asyncio code:

- :mod:`.server` — :func:`serve_grpc`: sockets, loop, drain, for the doors it is given;
- :mod:`.host` — :class:`GrpcHost`: the grpclib servers, call counting and the drain;
- :mod:`.door` — :class:`GrpcDoor`: what a door declares (its methods and their scopes);
- :mod:`.interceptor` — the token check and the call's record around every method;
- :mod:`.bridge` — how asyncio and trio call each other (trio-asyncio, one thread);
- :mod:`.h2` — every use of grpclib's private API (headers, connections), with
  :mod:`.wire` (one call's messages: framing, compression) and :mod:`.unary` (the lean
  path of a unary call);
- :mod:`.status` — exceptions to gRPC statuses.

The doors (Triton's in :mod:`actorserve.transport.grpc`, TorchServe's in
:mod:`actorserve.transport.torchserve`) are listed by :mod:`actorserve.server.doors`.
"""

from .door import Calls, GrpcDoor
from .host import GrpcHost
from .server import bind, serve_grpc

__all__ = ["Calls", "GrpcDoor", "GrpcHost", "bind", "serve_grpc"]
