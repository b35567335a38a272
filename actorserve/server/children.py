"""What the children of the multi-process server run (:mod:`actorserve.server.processes` starts
and stops them): the engine process (every model, serving the fronts on a Unix socket;
:data:`~actorserve.server.roles.SCALE_IN_SIGNAL` starts its scale-in drain) and a front process
(REST and gRPC on the inherited sockets, an engine client)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import trio

from ..addresses import BACKLOG
from ..engine import Engine, open_engine
from ..engine.gauges import watch_engine
from ..engine.repository import ModelRepository
from ..engine.scalein import drain_sequences
from ..settings import Settings
from ..tracing import exporting
from .composition import Server, serve_transports
from .heaptrim import freeze_startup_objects, trim_heap_when_idle
from .listeners import Listeners
from .roles import SCALE_IN_SIGNAL, engine_socket, say_ready, watch_parent

log = logging.getLogger(__name__)


async def run_engine_child(settings: Settings, repository: ModelRepository) -> None:
    """The engine process: load every model, serve the fronts on the Unix socket the
    parent named, until SIGTERM (drain within the grace period) or the parent's death."""
    from ..ipc.engine_side import open_unix_listener

    listener = await open_unix_listener(engine_socket(), backlog=BACKLOG)
    repository = repository.with_archive_limits(settings)
    with exporting(settings.otel):
        await _serve_engine(settings, repository, listener)


async def _serve_engine(
    settings: Settings, repository: ModelRepository, listener: trio.SocketListener
) -> None:
    from ..ipc.engine_side import serve_fronts

    async with open_engine(settings, repository=repository) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(watch_parent, nursery.cancel_scope)
        watch_engine(engine)
        nursery.start_soon(engine.metrics.keep_fresh)  # the live-work gauges the fronts' scrapes read
        nursery.start_soon(trim_heap_when_idle)  # its C heap back to the system once idle after load
        await nursery.start(serve_fronts, engine, listener)
        freeze_startup_objects()
        parent = os.getppid()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, SCALE_IN_SIGNAL) as signals:
            say_ready()  # once SCALE_IN_SIGNAL is caught: its default action ends the process
            async for signum in signals:
                if signum != SCALE_IN_SIGNAL:
                    break
                if not engine.draining:
                    nursery.start_soon(_scale_in_then_tell, engine, settings.drain_timeout, parent)
        log.info("engine: stopping (in-flight requests have %.1f s)", settings.grace_period)
        await engine.aclose(settings.grace_period)
        nursery.cancel_scope.cancel()


async def _scale_in_then_tell(engine: Engine, drain_timeout: float, parent: int) -> None:
    """The engine's drain (:func:`~actorserve.engine.scalein.drain_sequences`), then
    :data:`SCALE_IN_SIGNAL` to the parent, if it is still this process' parent."""
    await drain_sequences(engine, drain_timeout)
    if os.getppid() == parent:
        with contextlib.suppress(ProcessLookupError):
            os.kill(parent, SCALE_IN_SIGNAL)


async def run_front_child(settings: Settings) -> None:
    """A front process: the transports on the inherited sockets, an engine client to the
    engine process; SIGTERM drains (a second one stops at once)."""
    listeners = Listeners.inherited()
    try:
        with exporting(settings.otel):
            await _serve_front(settings, listeners)
    finally:
        listeners.close()


async def _serve_front(settings: Settings, listeners: Listeners) -> None:
    from ..ipc.client import open_engine_client

    async with open_engine_client(engine_socket()) as client, trio.open_nursery() as nursery:

        async def transports(*, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
            await serve_transports(client, settings, listeners, announce=False, task_status=task_status)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch_parent, nursery.cancel_scope, list(listeners.sockets().values()))
        server: Server = await nursery.start(transports)
        freeze_startup_objects()
        say_ready()
        nursery.start_soon(_front_signals, server, nursery.cancel_scope)


async def _front_signals(server: Server, scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if server.stopping:
                scope.cancel()
                return
            server.shutdown()


__all__ = ["run_engine_child", "run_front_child"]
