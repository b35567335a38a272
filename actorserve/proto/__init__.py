"""actorserve's gRPC wire format: Triton-compatible ``inference.GRPCInferenceService``.

- ``grpc_service.proto``: the service and messages (numbers from Triton's proto);
- :mod:`actorserve.proto.inference`: betterproto2 code generated from it (committed;
  regenerate with ``python -m actorserve.proto.regenerate``);
- :mod:`actorserve.proto.convert`: protobuf messages <-> :mod:`actorserve.types`.
"""
