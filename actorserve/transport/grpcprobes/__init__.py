"""The probes' gRPC door: the standard health service (``grpc.health.v1.Health``, what
Kubernetes gRPC probes, Envoy's health checks and ``grpc_health_probe`` call) and server
reflection (``grpc.reflection.v1`` and ``v1alpha``, what grpcurl and Postman use), on the
main gRPC port, both open (no token) like REST's health routes.

- :mod:`.door` — :class:`GrpcProbes`: the door's methods, all open;
- :mod:`.health` — Check and Watch, answered from the engine's readiness;
- :mod:`.reflection` — the served ``.proto`` files, from :mod:`actorserve.proto.served_descriptors`.
"""

from .door import GrpcProbes

__all__ = ["GrpcProbes"]
