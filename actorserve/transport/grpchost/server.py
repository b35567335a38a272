"""``serve_grpc``: the gRPC host's listening sockets, grpclib's loop, and the drain.

:func:`serve_grpc` serves the gRPC doors it is given (:class:`.door.GrpcDoor`) and owns
the loop (a trio-asyncio loop inside the caller's trio run, see :mod:`.bridge`), the
grpclib servers and, unless the caller passed one, the listening socket. Cancelling it drains: new calls get UNAVAILABLE, in-flight calls get
``settings.grace_period`` seconds (shielded), then what is left is cancelled and every
connection closed. The trio sides of calls live in trio-asyncio's own nursery, which the
outside cancellation does not reach until then.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence

import trio
import trio_asyncio

from ...addresses import BACKLOG, log_extra_address
from ...metrics import Metrics
from ...settings import Settings
from ...tracing import request_tracer
from ..access import AccessLog
from ..auth import Guard
from ..exchange import Recorder
from .bridge import to_aio
from .door import GrpcDoor
from .host import GrpcHost
from .loop import run_callbacks_in_batches

log = logging.getLogger("actorserve.transport.grpc")


async def serve_grpc(
    settings: Settings,
    doors: Sequence[GrpcDoor],
    *,
    sock: socket.socket | None = None,
    ports: Mapping[str, tuple[socket.socket, str]] | None = None,
    metrics: Metrics | None = None,
    access: AccessLog | None = None,
    guard: Guard | None = None,
    announce: bool = True,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``doors`` over gRPC until cancelled (the host: see the module docstring).

    Start it with ``await nursery.start(serve_grpc, settings, doors)``, which returns
    the bound ``(host, port)``. It listens on ``sock`` when given (a bound, listening
    TCP socket; the caller keeps owning it and closes it: until then, connections made
    after the drain wait in its backlog instead of being refused), else on a socket of
    its own bound to ``settings.host``:``settings.grpc_port`` (port 0 picks a free one). On
    cancellation it stops accepting calls, gives in-flight calls up to
    ``settings.grace_period`` seconds (shielded), then cancels what is left and closes
    every connection. ``OSError`` if the port cannot be bound. Calls are recorded in
    ``metrics`` and ``access``; ``guard`` says which scopes need a bearer token (each
    door says the scope of each of its methods). ``announce=False`` logs the listening
    lines at DEBUG only (a front process: its parent logs them once).

    ``ports`` (``{name: (socket, prefix)}``, each socket owned by the caller like
    ``sock``) are extra ports serving only the methods whose path starts with ``prefix``
    (TorchServe's ``ts_inference_grpc`` port serves only its inference service); with
    them and no ``sock``, gRPC serves on them alone. ``task_status`` then gets the first
    one's address.
    """
    recorder = Recorder(metrics if metrics is not None else Metrics(), access, request_tracer(settings.otel))
    host = GrpcHost(settings, recorder, guard)
    handlers = host.handlers(doors)
    extra = dict(ports or {})
    # grpclib's close() closes the socket it serves on: give it a duplicate of the
    # caller's, so the caller's stays open.
    listeners: list[tuple[socket.socket, str | None, str | None]] = []
    try:
        if sock is not None or not extra:
            listeners.append(
                (
                    sock.dup()
                    if sock is not None
                    else bind(settings.host, settings.grpc_port or 0, settings.backlog),
                    None,
                    None,
                )
            )
        listeners += [(extra_sock.dup(), name, prefix) for name, (extra_sock, prefix) in extra.items()]
        async with trio_asyncio.open_loop() as loop:
            run_callbacks_in_batches(loop)  # a trio round per batch of callbacks, not per callback
            servers = []
            try:
                for listener, name, prefix in listeners:
                    served = (
                        handlers
                        if prefix is None
                        else {path: h for path, h in handlers.items() if path.startswith(prefix)}
                    )
                    servers.append(await to_aio(host.start, listener, served))
                    address, port = listener.getsockname()[:2]
                    level = logging.INFO if announce else logging.DEBUG
                    if name is None:
                        log.log(level, "gRPC listening on %s:%d", address, port)
                    else:
                        log_extra_address(name, address, port, log, level)
                first_host, first_port = listeners[0][0].getsockname()[:2]
                task_status.started((first_host, first_port))
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    host.drain_started.set()
                    await to_aio(host.shut_down, *servers)
    finally:
        for listener, _, _ in listeners:
            listener.close()


def bind(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (the caller owns it)."""
    # IPPROTO_TCP explicitly: asyncio and grpclib set TCP_NODELAY only on sockets whose
    # proto says TCP; without it every call waits ~40 ms for Nagle + delayed ACKs.
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    return listener


__all__ = ["bind", "serve_grpc"]
