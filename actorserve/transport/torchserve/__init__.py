"""TorchServe's front door: its inference and management REST paths
(:mod:`.door`, over :mod:`.rest` and :mod:`.management_rest`) and its gRPC services
(:mod:`.grpc_services`, imported apart: it needs grpclib), onto the engine."""

from .door import TorchServeRest
from .management_rest import TorchServeManagement, not_on_management_port, on_management_port
from .rest import TorchServeInference

__all__ = [
    "TorchServeInference",
    "TorchServeManagement",
    "TorchServeRest",
    "not_on_management_port",
    "on_management_port",
]
