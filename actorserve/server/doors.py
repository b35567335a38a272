"""The server's doors: which HTTP and gRPC doors a server serves, in which order.

Adding a door is one package under :mod:`actorserve.transport` (an
:class:`~actorserve.transport.httphost.HttpDoor` or a
:class:`~actorserve.transport.grpchost.GrpcDoor`) and one line here; the hosts give it
what every request shares (listening, CORS, auth, the request records behind the
metrics and the access log, the drain, ``/metrics``). See docs/architecture.md.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from ..api import EngineAPI
from ..metrics import Metrics
from ..settings import Settings
from ..tracing import request_tracer
from ..transport.access import AccessLog
from ..transport.auth import Guard
from ..transport.exchange import Recorder
from ..transport.httphost import HttpDoor, HttpHost
from ..transport.openai import OpenAIRoutes
from ..transport.playground import Playground
from ..transport.rest import create_door
from ..transport.torchserve import TorchServeRest

if TYPE_CHECKING:
    from ..transport.grpchost import GrpcDoor


def http_doors(
    engine: EngineAPI, settings: Settings, recorder: Recorder, *, fast_path: bool = True
) -> list[HttpDoor]:
    """The REST doors, in the order the HTTP host asks them; the OIP's claims every path
    the others do not, so it comes last."""
    return [
        OpenAIRoutes(engine, settings.max_body_bytes),
        TorchServeRest(engine, settings.max_body_bytes),
        Playground(settings.gzip_min_bytes, settings.max_body_bytes),
        create_door(engine, settings, recorder, fast_path=fast_path),
    ]


def create_app(
    engine: EngineAPI,
    settings: Settings,
    *,
    fast_path: bool = True,
    metrics: Metrics | None = None,
    access: AccessLog | None = None,
    guard: Guard | None = None,
    torchserve_management: bool = False,
) -> HttpHost:
    """The ASGI application of a REST port: the HTTP host with :func:`http_doors`.
    Requests are recorded in ``metrics`` (default: a fresh :class:`Metrics`, which ``GET
    /metrics`` shows) and ``access`` (the access log, if on); ``guard`` decides which
    scopes need a bearer token (None: none). ``fast_path=False`` sends ``infer`` through
    Quart too (for comparison). ``torchserve_management``: TorchServe's management paths
    and ``/ping`` alone (its management port)."""
    recorder = Recorder(metrics if metrics is not None else Metrics(), access, request_tracer(settings.otel))
    if torchserve_management:
        door = TorchServeRest(engine, settings.max_body_bytes, management_port=True)
        return HttpHost([door], settings, recorder, guard=guard, metrics=False)
    doors = http_doors(engine, settings, recorder, fast_path=fast_path)
    return HttpHost(doors, settings, recorder, guard=guard)


def grpc_doors(engine: EngineAPI, settings: Settings) -> list[GrpcDoor]:
    """The gRPC doors, in the order the host registers them (imported here, on first use:
    a REST-only caller loads neither grpclib nor the gRPC doors)."""
    from ..transport.grpc import TritonGrpc
    from ..transport.grpcprobes import GrpcProbes
    from ..transport.torchserve.grpc_services import TorchServeGrpc

    return [TritonGrpc(engine, settings), TorchServeGrpc(engine, settings), GrpcProbes(engine, settings)]


async def serve_grpc(
    engine: EngineAPI,
    settings: Settings,
    *,
    sock: socket.socket | None = None,
    torchserve_only: Mapping[str, socket.socket] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    **observers: Any,
) -> None:
    """Serve ``engine`` over gRPC (every gRPC door) until cancelled: the gRPC host's
    :func:`~actorserve.transport.grpchost.serve_grpc` with :func:`grpc_doors` (see there
    for ``sock``, the drain, and ``observers``: ``metrics``, ``access``, ``guard``,
    ``announce``). ``torchserve_only`` (``{"inference" | "management": socket}``) are
    extra ports serving only that TorchServe service."""
    from ..transport.grpchost import serve_grpc as serve_doors
    from ..transport.torchserve.grpc_services import PORT_PREFIXES

    ports = {
        f"ts_{kind}_grpc": (extra, PORT_PREFIXES[kind]) for kind, extra in (torchserve_only or {}).items()
    }
    await serve_doors(
        settings, grpc_doors(engine, settings), sock=sock, ports=ports, task_status=task_status, **observers
    )


__all__ = ["create_app", "grpc_doors", "http_doors", "serve_grpc"]
