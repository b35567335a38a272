"""``serve``: the engine, the REST transport (quart-trio on hypercorn's trio worker) and
the gRPC transport, in one nursery.

::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(actorserve.serve, settings)
        ...  # server.http_url, server.engine
        server.shutdown()        # graceful: drain, then stop (or cancel the nursery)

Startup, in a fixed order: bind the listening sockets (:func:`open_listeners`; a port in
use fails here, before any model loads), load every model, then serve.

Shutdown, in a fixed order: refuse new requests (REST 503 with ``Retry-After``, gRPC
UNAVAILABLE), give in-flight requests ``Settings.grace_period`` seconds, then end whatever
is left with a last message saying the server is shutting down (an SSE ``event: error``,
a gRPC status; never a bare cut) and stop (every sequence ends with reason ``shutdown``).
With nothing in flight it stops at once. Cancelling the surrounding scope skips all that.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import attrs
import trio

from ..addresses import browsable, http_url, log_extra_address
from ..api import EngineAPI
from ..engine import open_engine
from ..engine.gauges import watch_engine
from ..engine.repository import ModelRepository
from ..engine.scalein import drain_sequences
from ..exceptiongroups import raise_single
from ..metrics import Metrics
from ..models import builtin_settings as builtin_models
from ..replica import replica_id
from ..settings import Settings, SettingsError
from ..tempdirs import remove_stale
from ..tracing import exporting
from ..transport.access import AccessLog
from ..transport.auth import Guard
from ..transport.httphost import Drain
from ..transport.httphost.serve import END_MARGIN, serve_http
from ..transport.owner import OwnerScope, OwnerStamp
from .doors import create_app, serve_grpc
from .heaptrim import freeze_startup_objects, trim_heap_when_idle
from .listeners import ListenError, Listeners, open_listeners
from .logformat import quiet_protocol_loggers
from .tokens import auth_enabled, read_tokens, remove_token_file, with_token

log = logging.getLogger("actorserve.server")  # the package's name: what its log lines have always said

Address = tuple[str, int]


@attrs.define(eq=False)
class Server:
    """A running actorserve, as returned by ``await nursery.start(serve, settings)``."""

    #: the engine the transports call: the in-process :class:`~actorserve.engine.Engine`
    #: for :func:`serve`, an engine client in a front process
    engine: EngineAPI
    settings: Settings
    #: (host, port) the REST transport is bound to, or None when it is off.
    http_address: Address | None = None
    #: (host, port) of the gRPC transport, or None when it is off or unavailable.
    grpc_address: Address | None = None
    #: (host, port) of each extra TorchServe port that is on, by its :class:`Listeners`
    #: field: ``ts_inference_grpc``, ``ts_management_grpc``, ``ts_management_http``
    extra_addresses: dict[str, Address] = attrs.field(factory=dict)
    #: what ``GET /metrics`` shows (in a front of the multi-process server: the server's)
    metrics: Metrics | None = None
    _stopping: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def http_url(self) -> str | None:
        """``http://host:port`` of the REST transport."""
        if self.http_address is None:
            return None
        host, port = self.http_address
        return http_url(host, port)

    @property
    def stopping(self) -> bool:
        """True once a graceful shutdown has started."""
        return self._stopping.is_set()

    def shutdown(self) -> None:
        """Start a graceful shutdown; :func:`serve` returns once it is done."""
        self._stopping.set()


async def serve(
    settings: Settings | None = None,
    *,
    repository: ModelRepository | None = None,
    listeners: Listeners | None = None,
    rest_fast_path: bool = True,
    freeze_heap: bool = False,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until :meth:`Server.shutdown` (graceful) or cancellation (immediate).

    Without ``settings`` the built-in models are served. The listening sockets are bound
    first (:func:`open_listeners`), so a port in use raises :class:`ListenError` before any
    model loads; or pass ``listeners`` bound beforehand (``serve`` then owns and closes
    them, and serves REST / gRPC on whichever of them is not None).
    ``task_status.started`` gets the :class:`Server` once every model is loaded and every
    listener is serving (port 0 picks a free port: read the real one from
    ``server.http_address``). ``repository`` is where
    ``POST /v2/repository/models/{name}/load`` looks (default: ``settings.models``).
    ``rest_fast_path=False`` serves ``infer`` through Quart too (for comparisons).
    ``freeze_heap=True`` (a process that only serves, as the CLI's) freezes the objects
    alive once the models are loaded (:func:`~actorserve.server.heaptrim.freeze_startup_objects`).

    With auth on and no token given, a token is generated into a new file (mode 0600)
    whose path is logged and is ``server.settings.token_file``; it is removed on return."""
    if settings is None:
        settings = Settings(models=tuple(builtin_models()))
    if listeners is None:
        listeners = open_listeners(settings)
    remove_stale()  # what servers killed before left behind
    repository = (repository or ModelRepository()).with_archive_limits(settings)
    generated = None
    try:
        settings, generated = with_token(settings)
        with exporting(settings.otel):
            await _serve_in_process(settings, repository, listeners, rest_fast_path, freeze_heap, task_status)
    except BaseExceptionGroup as group:  # e.g. a model that fails to load: raise it itself
        raise_single(group)
    finally:
        listeners.close()
        if generated is not None:
            remove_token_file(generated)
    log.info("actorserve stopped")


async def _serve_in_process(
    settings: Settings,
    repository: ModelRepository,
    listeners: Listeners,
    rest_fast_path: bool,
    freeze_heap: bool,
    task_status: trio.TaskStatus[Server],
) -> None:
    """:func:`serve`'s engine and transports in this process."""
    async with open_engine(settings, repository=repository) as engine:
        watch_engine(engine)  # its live-work gauges, read at each scrape
        if freeze_heap:
            freeze_startup_objects()
        await serve_transports(
            engine,
            settings,
            listeners,
            drain=engine.aclose,
            scale_in=partial(drain_sequences, engine, settings.drain_timeout)
            if settings.drain_timeout
            else None,
            rest_fast_path=rest_fast_path,
            metrics=engine.metrics,  # the engine's and the transports' series in one registry
            task_status=task_status,
        )


async def serve_transports(
    engine: EngineAPI,
    settings: Settings,
    listeners: Listeners,
    *,
    drain: Callable[[float], Awaitable[None]] | None = None,
    scale_in: Callable[[], Awaitable[object]] | None = None,
    rest_fast_path: bool = True,
    metrics: Metrics | None = None,
    announce: bool = True,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve REST and gRPC for ``engine`` on ``listeners`` until :meth:`Server.shutdown`
    (graceful) or cancellation. Used by :func:`serve` (with the in-process engine) and by
    every front process of the multi-process server (with an engine client).

    On shutdown, ``scale_in()`` first, when given (:func:`~actorserve.engine.scalein.drain_sequences`:
    the open sequences are served while new starts are refused); then gRPC drains its calls and hypercorn its connections, while ``drain(grace)``
    (the in-process engine's ``aclose``; nothing in a front, whose engine process is
    stopped after every front) lets in-flight requests finish; all within the grace period.
    The caller owns ``listeners``. Requests are recorded in ``metrics`` (default: a new
    :class:`Metrics`); the tokens come from ``settings`` (:func:`actorserve.server.tokens.read_tokens`).
    The protocol libraries' loggers are capped at INFO (:func:`quiet_protocol_loggers`):
    at DEBUG they write every header, a bearer token included. ``announce=False`` (a
    front process) logs the listening lines at DEBUG: the parent logs them once."""
    quiet_protocol_loggers()
    metrics = metrics if metrics is not None else Metrics()
    server = Server(engine, settings, metrics=metrics)
    metrics.replica_info.labels(replica_id(settings.replica_id)).set(1)
    tokens = read_tokens(settings)
    if auth_enabled(settings) and not tokens:
        raise SettingsError("auth is on but no token was given (token or token_file; or no_auth)")
    guard = Guard(
        tokens,
        management=not settings.no_auth,
        inference=settings.auth_inference,
        metrics=settings.auth_metrics,
    )
    # the doors' engine: every inference request says who sent it (bind_sequences_to_token)
    doors = cast(EngineAPI, OwnerStamp(engine, bind=settings.bind_sequences_to_token))
    http_stopped, ts_http_stopped = trio.Event(), trio.Event()
    #: set once the REST ports have no request left (or the grace period ended them): hypercorn stops
    http_done = trio.Event()
    drains: list[Drain] = []
    grpc_scope = trio.CancelScope()
    ts_grpc = {
        kind: sock for kind in ("inference", "management") if (sock := getattr(listeners, f"ts_{kind}_grpc"))
    }
    async with trio.open_nursery() as nursery:
        nursery.start_soon(metrics.keep_fresh)  # this process's live gauges, for the other processes' scrapes
        nursery.start_soon(trim_heap_when_idle)  # the peak of a burst of connections goes back to the system
        access = AccessLog() if settings.access_log else None
        if access is not None:
            await nursery.start(access.run)
        if listeners.http is not None:
            app = create_app(
                doors, settings, fast_path=rest_fast_path, metrics=metrics, access=access, guard=guard
            )
            owned = OwnerScope(app, guard) if settings.bind_sequences_to_token else app
            drains.append(Drain(owned, app.door_for))
            server.http_address = await nursery.start(
                serve_http, drains[-1], listeners.http, settings, http_done, http_stopped
            )
        else:
            http_stopped.set()
        if listeners.ts_management_http is not None:  # only TorchServe's management paths and /ping
            app = create_app(
                engine, settings, metrics=metrics, access=access, guard=guard, torchserve_management=True
            )
            drains.append(Drain(app, app.door_for))
            server.extra_addresses["ts_management_http"] = await nursery.start(
                serve_http, drains[-1], listeners.ts_management_http, settings, http_done, ts_http_stopped
            )
        else:
            ts_http_stopped.set()
        if listeners.grpc is not None or ts_grpc:
            grpc_address = await _start_grpc(
                nursery,
                doors,
                settings,
                listeners.grpc,
                ts_grpc,
                grpc_scope,
                metrics=metrics,
                access=access,
                guard=guard,
                announce=announce,
            )
            if grpc_address is not None:
                server.grpc_address = grpc_address if listeners.grpc is not None else None
                server.extra_addresses.update(
                    {f"ts_{kind}_grpc": _address(sock) for kind, sock in ts_grpc.items()}
                )
        level = logging.INFO if announce else logging.DEBUG
        if server.http_url is not None:
            log.log(
                level, "REST listening on %s (playground: %s/)", server.http_url, browsable(server.http_url)
            )
        if "ts_management_http" in server.extra_addresses:
            log_extra_address("ts_management_http", *server.extra_addresses["ts_management_http"], log, level)
        task_status.started(server)
        await server._stopping.wait()
        if scale_in is not None:  # first serve the open sequences (not ready, no new starts)
            await scale_in()
        log.log(level, "shutting down: in-flight requests have %.1f s to finish", settings.grace_period)
        await _drain(settings.grace_period, drains, grpc_scope, http_done, drain)
        with trio.move_on_after(END_MARGIN + 1.0):  # hypercorn writes the last chunks, closes
            await http_stopped.wait()
            await ts_http_stopped.wait()
        nursery.cancel_scope.cancel()


async def _drain(
    grace: float,
    drains: list[Drain],
    grpc_scope: trio.CancelScope,
    http_done: trio.Event,
    drain: Callable[[float], Awaitable[None]] | None,
) -> None:
    """The ordered stop of the transports: refuse new requests (REST 503, gRPC
    UNAVAILABLE), let the ones in flight finish within ``grace`` seconds, then end the
    rest with a last message saying the server is shutting down; stop at once when
    nothing is in flight. The in-process engine's ``drain`` runs beside it."""
    for gate in drains:
        gate.start()
    grpc_scope.cancel()  # gRPC drains its calls (shielded, within the grace period)
    async with trio.open_nursery() as draining:
        if drain is not None:  # the in-process engine: its requests all come through the transports
            draining.start_soon(drain, grace + END_MARGIN)
        with trio.move_on_after(grace):
            for gate in drains:
                await gate.idle.wait()
        left = sum(gate.running for gate in drains)
        if left:
            log.warning("REST: ending %d request(s) still running after the grace period", left)
        for gate in drains:
            gate.end_all()
        http_done.set()


def _address(sock: socket.socket) -> Address:
    host, port = sock.getsockname()[:2]
    return (str(host), int(port))


async def _start_grpc(
    nursery: trio.Nursery,
    engine: EngineAPI,
    settings: Settings,
    sock: socket.socket | None,
    torchserve_only: dict[str, socket.socket],
    scope: trio.CancelScope,
    **observers: Any,
) -> Address:
    """Start the gRPC host on ``sock`` and the extra TorchServe ports in ``scope``
    (cancelling it starts gRPC's own drain)."""

    async def run(*, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve_grpc(
                engine,
                settings,
                sock=sock,
                torchserve_only=torchserve_only,
                task_status=task_status,
                **observers,
            )

    host, port = await nursery.start(run)
    return (str(host), int(port))


__all__ = [
    "ListenError",
    "Listeners",
    "Server",
    "open_listeners",
    "serve",
    "serve_transports",
]
