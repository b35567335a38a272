"""The one table from domain errors to wire status, for REST and gRPC alike.

Anything that is not an :class:`~actorserve.errors.ActorServeError` is a bug: it maps to
500 / INTERNAL with a generic message (the traceback goes to the log, not the client).
"""

from __future__ import annotations

from typing import Final

from grpclib.const import Status

from ..errors import (
    ActorServeError,
    BadInput,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    SequenceConflict,
    SequenceNotFound,
    ShuttingDown,
)

#: domain error -> (HTTP status, gRPC status)
ERROR_TABLE: Final[dict[type[ActorServeError], tuple[int, Status]]] = {
    BadInput: (400, Status.INVALID_ARGUMENT),
    ModelNotFound: (404, Status.NOT_FOUND),
    SequenceNotFound: (404, Status.NOT_FOUND),
    SequenceConflict: (409, Status.ALREADY_EXISTS),
    Overloaded: (429, Status.RESOURCE_EXHAUSTED),
    ModelFailed: (500, Status.INTERNAL),
    ModelNotReady: (503, Status.UNAVAILABLE),
    ShuttingDown: (503, Status.UNAVAILABLE),
}

#: seconds a client is told to wait after 429 / 503.
RETRY_AFTER_SECONDS: Final = 1


def _lookup(error: BaseException) -> tuple[int, Status]:
    for cls in type(error).__mro__:
        entry = ERROR_TABLE.get(cls)
        if entry is not None:
            return entry
    return 500, Status.INTERNAL


def http_status(error: BaseException) -> int:
    return _lookup(error)[0]


def grpc_status(error: BaseException) -> Status:
    return _lookup(error)[1]


def client_message(error: BaseException) -> str:
    """What the client is told: the domain message, or a generic one for a bug."""
    if isinstance(error, ActorServeError):
        return error.message
    return f"internal error: {type(error).__name__}"
