"""Exceptions to gRPC statuses for this transport (the mapping itself is the one table
in :mod:`actorserve.transport.errors`)."""

from __future__ import annotations

import logging

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ...errors import ActorServeError
from ..errors import client_message, grpc_status

log = logging.getLogger("actorserve.transport.grpc")


def status_error(exc: BaseException) -> GRPCError:
    """The :class:`GRPCError` a client gets for ``exc``: a ``GRPCError`` as it is, a
    domain error by the table, anything else (a bug) logged with its traceback and sent
    as INTERNAL."""
    if isinstance(exc, GRPCError):
        return exc
    if not isinstance(exc, ActorServeError):
        log.error("gRPC: unexpected error", exc_info=exc)
    return GRPCError(Status(grpc_status(exc)), client_message(exc))


def shutting_down() -> GRPCError:
    """What a call gets while the server drains."""
    return GRPCError(Status.UNAVAILABLE, "the server is shutting down")


__all__ = ["shutting_down", "status_error"]
