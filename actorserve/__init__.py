"""actorserve: an Open Inference Protocol server for streaming and stateful models on trio.

Public API::

    async with actorserve.open_engine(settings) as engine: ...     # in-process engine
    await nursery.start(actorserve.serve, settings)                # engine + REST + gRPC
"""

from __future__ import annotations

from typing import Any

from .engine import Engine, open_engine
from .errors import (
    ActorServeError,
    BadInput,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    SequenceConflict,
    SequenceNotFound,
    SequenceNotHeld,
    ShuttingDown,
)
from .model import BatchModel, Model, StepOutput
from .settings import ModelSettings, SequenceSettings, Settings
from .types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from .version import __version__

__all__ = [
    "ActorServeError",
    "BadInput",
    "BatchModel",
    "Engine",
    "InferenceRequest",
    "InferenceResponse",
    "Model",
    "ModelFailed",
    "ModelNotFound",
    "ModelNotReady",
    "ModelSettings",
    "Overloaded",
    "RequestedOutput",
    "SequenceConflict",
    "SequenceNotFound",
    "SequenceNotHeld",
    "SequenceSettings",
    "Settings",
    "ShuttingDown",
    "StepOutput",
    "Tensor",
    "__version__",
    "open_engine",
    "serve",
]


async def serve(settings: Settings | None = None, **kwargs: Any) -> None:
    """Run the engine and the transports until cancelled; see :mod:`actorserve.server`.

    Use ``await nursery.start(actorserve.serve, settings)``: it returns the bound
    addresses once every model is loaded and every listener is up."""
    from .server.composition import serve as _serve

    await _serve(settings, **kwargs)
