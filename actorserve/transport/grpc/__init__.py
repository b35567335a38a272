"""The gRPC transport: Triton's ``inference.GRPCInferenceService`` served by grpclib,
typed against :class:`~actorserve.api.EngineAPI` only.

grpclib runs on asyncio only, so this package holds actorserve's asyncio code:

- :mod:`.server` — :func:`serve_grpc`: socket, loop, drain;
- :mod:`.bridge` — how asyncio and trio call each other (trio-asyncio, one thread);
- :mod:`.service` — :class:`InferenceService`: the handlers, unary RPCs;
- :mod:`.streams` — ModelStreamInfer (Triton and MLServer dialects), coalesced writes;
- :mod:`.h2` — every use of grpclib's private API (headers, compression, framing);
- :mod:`.status` — exceptions to gRPC statuses.
"""

from .server import serve_grpc
from .service import EXTENSIONS, InferenceService

__all__ = ["EXTENSIONS", "InferenceService", "serve_grpc"]
