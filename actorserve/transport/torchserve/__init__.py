"""TorchServe's front door: its inference and management REST paths
(:mod:`.rest`, :mod:`.management_rest`) and its gRPC services, onto the engine."""

from .management_rest import TorchServeManagement, not_on_management_port, on_management_port
from .rest import TorchServeInference

__all__ = ["TorchServeInference", "TorchServeManagement", "not_on_management_port", "on_management_port"]
