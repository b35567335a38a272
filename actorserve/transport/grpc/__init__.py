"""Triton's gRPC door: ``inference.GRPCInferenceService`` (and ``actorserve.v1.Management``)
served by the gRPC host (:mod:`actorserve.transport.grpchost`), typed against
:class:`~actorserve.api.EngineAPI` only.

- :mod:`.door` — :class:`TritonGrpc`: the door's methods and the auth scope of each;
- :mod:`.service` — :class:`InferenceService`: the handlers, unary RPCs;
- :mod:`.management_service` — ``actorserve.v1.Management``;
- :mod:`.streams` — ModelStreamInfer (Triton and MLServer dialects), coalesced writes;
- :mod:`.routing` — a stream's sequence routing key;
- :mod:`.triton_pb` — Triton's config and statistics as protobuf.
"""

from .door import TritonGrpc
from .service import InferenceService

__all__ = ["InferenceService", "TritonGrpc"]
