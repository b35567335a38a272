"""The probes' door: ``grpc.health.v1.Health`` and server reflection on the gRPC host."""

from __future__ import annotations

from collections.abc import Mapping

from grpclib.const import Handler

from ...api import EngineAPI
from ...settings import Settings
from ..auth import Scope
from ..grpchost.door import Calls
from .health import HealthService
from .reflection import ReflectionService


class GrpcProbes:
    """The door: health and reflection, typed against :class:`~actorserve.api.EngineAPI`.
    Every method is open (no token), as REST's ``/v2/health/*`` are: a probe carries
    none, and neither answer tells more than ``ServerReady`` / ``ModelReady`` do."""

    def __init__(self, engine: EngineAPI, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    def handlers(self, calls: Calls) -> Mapping[str, Handler]:
        health = HealthService(self.engine, self.settings, calls)
        return {**health.__mapping__(), **ReflectionService(self.settings).__mapping__()}

    @staticmethod
    def auth_scope(method: str) -> Scope | None:
        return None


__all__ = ["GrpcProbes"]
