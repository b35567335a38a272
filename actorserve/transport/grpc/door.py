"""Triton's gRPC door: ``inference.GRPCInferenceService`` and ``actorserve.v1.Management``
on the gRPC host (:mod:`actorserve.transport.grpchost`), and the auth scope of each method."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from grpclib.const import Handler

from ...api import EngineAPI
from ...settings import Settings
from ..auth import Scope
from ..grpchost.door import Calls
from .management_service import SERVICE as MANAGEMENT_SERVICE
from .management_service import ManagementService
from .service import SERVICE, InferenceService

#: methods of ``GRPCInferenceService`` with this prefix (load, unload, whatever is added
#: there) are management, as is every method of ``actorserve.v1.Management``
MANAGEMENT_PREFIXES: Final = (SERVICE + "RepositoryModel", MANAGEMENT_SERVICE)
#: the inference methods (``--auth-inference``)
INFERENCE_METHODS: Final = frozenset({SERVICE + "ModelInfer", SERVICE + "ModelStreamInfer"})


class TritonGrpc:
    """The door: Triton's service and ours, typed against :class:`~actorserve.api.EngineAPI`."""

    def __init__(self, engine: EngineAPI, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    def handlers(self, calls: Calls) -> Mapping[str, Handler]:
        service = InferenceService(self.engine, self.settings, calls)
        return {**service.__mapping__(), **ManagementService(self.engine, service).__mapping__()}

    @staticmethod
    def auth_scope(method: str) -> Scope | None:
        if method in INFERENCE_METHODS:
            return Scope.INFERENCE
        if method.startswith(MANAGEMENT_PREFIXES):
            return Scope.MANAGEMENT
        return None


__all__ = ["INFERENCE_METHODS", "MANAGEMENT_PREFIXES", "TritonGrpc"]
