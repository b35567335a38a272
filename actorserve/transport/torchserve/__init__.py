"""TorchServe's front door: its inference and management REST paths
(:mod:`.rest`, :mod:`.management_rest`) and its gRPC services, onto the engine."""

from .management_rest import TorchServeManagement
from .rest import TorchServeInference

__all__ = ["TorchServeInference", "TorchServeManagement"]
