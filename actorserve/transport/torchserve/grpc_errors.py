"""TorchServe's errors over gRPC: its HTTP code mapped to a gRPC status as its
``GRPCUtils`` does, the in-band ``google.rpc.Status`` (with an ``ErrorInfo``) of
StreamPredictions2, and the note a call's record takes of a model that does not exist.
No I/O."""

from __future__ import annotations

from typing import Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ...proto.torchserve.google.protobuf import Any as PbAny
from ...proto.torchserve.google.rpc import ErrorInfo
from ...proto.torchserve.google.rpc import Status as RpcStatus
from ..exchange import Exchange
from .errors import TsError, names_no_model

#: TorchServe's GRPCUtils.getGRPCStatusCode
_CODES: Final = {
    400: Status.INVALID_ARGUMENT,
    401: Status.UNAUTHENTICATED,
    403: Status.PERMISSION_DENIED,
    404: Status.NOT_FOUND,
    409: Status.ABORTED,
    413: Status.RESOURCE_EXHAUSTED,
    429: Status.RESOURCE_EXHAUSTED,
    416: Status.OUT_OF_RANGE,
    499: Status.CANCELLED,
    501: Status.UNIMPLEMENTED,
    503: Status.UNAVAILABLE,
    504: Status.DEADLINE_EXCEEDED,
}

#: the Java package of TorchServe's exceptions that are not in ``org.pytorch.serve.http``
_PACKAGES: Final = {
    "ModelNotFoundException": "org.pytorch.serve.archive.model",
    "ModelVersionNotFoundException": "org.pytorch.serve.archive.model",
}


def noted(exchange: Exchange | None, error: TsError) -> TsError:
    """``error``, noted in the call's exchange when it says the model does not exist (its
    name came from the client: no metrics label)."""
    if exchange is not None and names_no_model(error):
        exchange.not_found = True
    return error


def grpc_code(http: int) -> Status:
    if http in _CODES:
        return _CODES[http]
    return Status.OK if 200 <= http < 300 else Status.INTERNAL


def grpc_error(error: TsError) -> GRPCError:
    return GRPCError(grpc_code(error.code), error.message)


def rpc_status(error: TsError) -> RpcStatus:
    """An in-band StreamPredictions2 error; its ``ErrorInfo`` reason is the exception's
    Java name as TorchServe gives it (a reason with a dot in it is given whole)."""
    reason = error.type or "InternalServerException"
    if "." not in reason:
        reason = f"{_PACKAGES.get(reason, 'org.pytorch.serve.http')}.{reason}"
    detail = PbAny.pack(ErrorInfo(reason=reason))
    return RpcStatus(code=grpc_code(error.code).value, message=error.message, details=[detail])


def handler_status(error: TsError) -> RpcStatus:
    """A handler's failed answer in band: TorchServe's worker reports every one as
    ``InternalServerException`` (``GRPCJob.sendError``), whatever the handler raised."""
    return rpc_status(TsError(error.code, "InternalServerException", error.message))


__all__ = ["grpc_code", "grpc_error", "handler_status", "noted", "rpc_status"]
