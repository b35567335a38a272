"""What wraps every gRPC call, of every service the server registers: the bearer-token
check (by method path, see :mod:`actorserve.transport.auth`), and the call's
:class:`~actorserve.transport.exchange.Exchange` (access log; metrics of unary inference).

Applied by the host to every method of every door (:meth:`.host.GrpcHost.handlers`), so a
door added later is covered by the same rules.
Runs on grpclib's asyncio loop, before the handler reads anything.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import TYPE_CHECKING, Any, Final

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ..auth import FORBIDDEN, UNAUTHORIZED, Guard, Scope, Verdict
from ..exchange import Exchange, Recorder
from ..owner import OWNER, owner_of
from .unary import keep_lean

if TYPE_CHECKING:
    from ...otel import RequestSpan, RequestTracer

#: The exchange of the call being served (set in the handler's asyncio task).
CALL: Final = contextvars.ContextVar[Exchange | None]("actorserve_grpc_call", default=None)

#: methods whose calls make no span (by the end of their path): probes, with no trace
UNTRACED_METHODS: Final = ("/ServerLive", "/ServerReady", "/Ping", "/grpc.health.v1.Health/Check")

#: gRPC status -> the HTTP status of the same outcome (for the metrics' ``outcome``).
HTTP_OF: Final = {
    Status.OK: 200,
    Status.INVALID_ARGUMENT: 400,
    Status.UNAUTHENTICATED: 401,
    Status.PERMISSION_DENIED: 403,
    Status.NOT_FOUND: 404,
    Status.ALREADY_EXISTS: 409,
    Status.RESOURCE_EXHAUSTED: 429,
    Status.UNIMPLEMENTED: 501,
    Status.UNAVAILABLE: 503,
    Status.DEADLINE_EXCEEDED: 504,
}


def guarded(
    path: str, handler: Handler, guard: Guard | None, recorder: Recorder, needed: Scope | None = None
) -> Handler:
    """``handler`` (of method ``path``) with the token check (``guard``: None when the
    method's scope, as its door says, needs no token here; ``needed``: that scope, which
    the token's own must cover, else PERMISSION_DENIED) and the call's exchange."""
    func = handler.func
    needs_token = guard is not None

    async def call(stream: Stream[Any, Any]) -> None:
        exchange = Exchange("grpc", "POST", path)
        exchange.bytes = None
        exchange.recorder = recorder
        if recorder.tracer is not None and not path.endswith(UNTRACED_METHODS):
            exchange.span = _call_span(recorder.tracer, path, stream)
        token = CALL.set(exchange)
        owned = OWNER.set(None)
        status = Status.OK
        try:
            if needs_token:
                assert guard is not None
                metadata: Any = stream.metadata or {}
                authorization = metadata.get("authorization")
                verdict = guard.verdict(needed or Scope.MANAGEMENT, authorization)
                if verdict is Verdict.UNAUTHORIZED:
                    raise GRPCError(Status.UNAUTHENTICATED, UNAUTHORIZED)
                if verdict is Verdict.FORBIDDEN:
                    raise GRPCError(Status.PERMISSION_DENIED, FORBIDDEN)
                owner = owner_of(guard, authorization)
                OWNER.set(owner)  # who calls, for sequences bound to tokens (transport/owner.py)
            await func(stream)
        except GRPCError as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = Status.CANCELLED
            raise
        except Exception:
            status = Status.INTERNAL
            raise
        finally:
            CALL.reset(token)
            OWNER.reset(owned)
            exchange.status = status.name
            outcome = None if status is Status.CANCELLED else HTTP_OF.get(status, 500)
            recorder.finish(exchange, outcome)

    return Handler(keep_lean(func, call), handler.cardinality, handler.request_type, handler.reply_type)


def _call_span(tracer: RequestTracer, path: str, stream: Stream[Any, Any]) -> RequestSpan:
    """The span of the gRPC call of method ``path``, child of the client's ``traceparent``."""
    metadata: Any = stream.metadata or {}
    parent, state = metadata.get("traceparent"), metadata.get("tracestate")
    name = path.lstrip("/")
    service, _, method = name.partition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
    return tracer.start(
        name,
        "grpc",
        attributes,
        parent if isinstance(parent, str) else None,
        state if isinstance(state, str) else None,
    )


def call_exchange() -> Exchange | None:
    """The exchange of the call this task serves (None outside a wrapped call)."""
    return CALL.get()


__all__ = ["CALL", "HTTP_OF", "UNTRACED_METHODS", "call_exchange", "guarded"]
