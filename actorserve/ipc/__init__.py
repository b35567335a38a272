"""The engine in its own process: the link between front processes and the engine.

:mod:`~actorserve.ipc.frames` and :mod:`~actorserve.ipc.values` are the wire format
(no I/O); :func:`serve_fronts` is the engine process's end, :class:`EngineClient` (made
by :func:`open_engine_client`) a front's. See docs/architecture.md, "Processes".
"""

from .call_ends import LinkStatistics, RemoteResponses
from .client import EngineClient, open_engine_client
from .engine_side import FrontConnection, open_unix_listener, serve_fronts
from .frames import LinkLimits
from .values import EngineInternalError, WireError

__all__ = [
    "EngineClient",
    "EngineInternalError",
    "FrontConnection",
    "LinkLimits",
    "LinkStatistics",
    "RemoteResponses",
    "WireError",
    "open_engine_client",
    "open_unix_listener",
    "serve_fronts",
]
