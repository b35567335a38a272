"""The one table from domain errors to wire status, for REST and gRPC alike.

Anything that is not an :class:`~actorserve.errors.ActorServeError` is a bug: it maps to
500 / INTERNAL with a generic message (the traceback goes to the log, not the client).
"""

from __future__ import annotations

import enum
from typing import Final

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


class BodyTooLarge(Exception):
    """A REST request body (read or inflated) is over ``max_body_bytes``: answered 413."""


class BodyTimeout(Exception):
    """A REST request body did not arrive within ``read_timeout`` of its head: answered
    408 (and the connection closed)."""


class GrpcCode(enum.IntEnum):
    """The gRPC status codes this table uses (the numbers are the wire's; grpclib's
    ``Status`` has the same values). Kept here so REST never imports grpclib."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14


#: domain error -> (HTTP status, gRPC status)
ERROR_TABLE: Final[dict[type[ActorServeError], tuple[int, GrpcCode]]] = {
    BadInput: (400, GrpcCode.INVALID_ARGUMENT),
    ModelNotFound: (404, GrpcCode.NOT_FOUND),
    SequenceNotFound: (404, GrpcCode.NOT_FOUND),
    SequenceConflict: (409, GrpcCode.ALREADY_EXISTS),
    Overloaded: (429, GrpcCode.RESOURCE_EXHAUSTED),
    ModelFailed: (500, GrpcCode.INTERNAL),
    ModelNotReady: (503, GrpcCode.UNAVAILABLE),
    ShuttingDown: (503, GrpcCode.UNAVAILABLE),
}

#: seconds a client is told to wait after 429 / 503.
RETRY_AFTER_SECONDS: Final = 1


def _lookup(error: BaseException) -> tuple[int, GrpcCode]:
    for cls in type(error).__mro__:
        entry = ERROR_TABLE.get(cls)
        if entry is not None:
            return entry
    return 500, GrpcCode.INTERNAL


def http_status(error: BaseException) -> int:
    return _lookup(error)[0]


def grpc_status(error: BaseException) -> GrpcCode:
    """The gRPC code (an int; ``grpclib.const.Status(code)`` on the gRPC side)."""
    return _lookup(error)[1]


def client_message(error: BaseException) -> str:
    """What the client is told: the domain message, or a generic one for a bug."""
    if isinstance(error, ActorServeError):
        return error.message
    return f"internal error: {type(error).__name__}"
