"""The engine in its own process: the link between front processes and the engine.

:mod:`~actorserve.ipc.frames`, :mod:`~actorserve.ipc.values`, :mod:`~actorserve.ipc.deltas`
and :mod:`~actorserve.ipc.unary_values` are the wire format (no I/O);
:func:`~actorserve.ipc.engine_side.serve_fronts` is the engine process's end,
:class:`EngineClient` (made by :func:`open_engine_client`) a front's. See
docs/architecture.md, "Processes".

This face exports the front's end only: a front imports no engine code (the engine's end,
``engine_side``, is imported by its own name, in the engine process).
"""

from .call_ends import LinkStatistics, RemoteResponses
from .client import EngineClient, open_engine_client
from .frames import LinkLimits
from .values import EngineInternalError, WireError

__all__ = [
    "EngineClient",
    "EngineInternalError",
    "LinkLimits",
    "LinkStatistics",
    "RemoteResponses",
    "WireError",
    "open_engine_client",
]
