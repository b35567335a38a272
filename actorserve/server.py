"""``serve``: the engine, the REST transport (quart-trio on hypercorn's trio worker) and
the gRPC transport, in one nursery.

::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(actorserve.serve, settings)
        ...  # server.http_url, server.engine
        server.shutdown()        # graceful: drain, then stop (or cancel the nursery)

Shutdown, in a fixed order: stop accepting connections and requests, give in-flight
requests ``Settings.grace_period`` seconds, then cancel whatever is left (every sequence
ends with reason ``shutdown``). Cancelling the surrounding scope skips the grace period.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from urllib.parse import urlsplit

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from .engine import Engine, open_engine, raise_single
from .repository import ModelRepository
from .settings import ModelSettings, Settings, builtin_models
from .transport.rest import RestApp, create_app

log = logging.getLogger(__name__)

Address = tuple[str, int]
#: the settings of every version of a model, for gRPC's RepositoryModelLoad
FindModels = Callable[[str], list[ModelSettings]]


@attrs.define(eq=False)
class Server:
    """A running actorserve, as returned by ``await nursery.start(serve, settings)``."""

    engine: Engine
    settings: Settings
    #: (host, port) the REST transport is bound to, or None when it is off.
    http_address: Address | None = None
    #: (host, port) of the gRPC transport, or None when it is off or unavailable.
    grpc_address: Address | None = None
    _stopping: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def http_url(self) -> str | None:
        """``http://host:port`` of the REST transport."""
        if self.http_address is None:
            return None
        host, port = self.http_address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

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
    rest_fast_path: bool = True,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until :meth:`Server.shutdown` (graceful) or cancellation (immediate).

    Without ``settings`` the built-in models are served. ``task_status.started`` gets the
    :class:`Server` once every model is loaded and every listener is bound (port 0 picks
    a free port: read the real one from ``server.http_address``). ``repository`` is where
    ``POST /v2/repository/models/{name}/load`` looks (default: ``settings.models``).
    ``rest_fast_path=False`` serves ``infer`` through Quart too (for comparisons)."""
    if settings is None:
        settings = Settings(models=tuple(builtin_models()))
    repository = repository or ModelRepository()
    find_models: FindModels = partial(repository.find, known=settings.models)
    try:
        async with open_engine(settings, repository=repository) as engine:
            server = Server(engine, settings)
            http_stopped = trio.Event()
            grpc_scope = trio.CancelScope()
            async with trio.open_nursery() as nursery:
                if settings.http_port is not None:
                    app = create_app(engine, settings, fast_path=rest_fast_path)
                    server.http_address = await nursery.start(
                        _serve_http, app, settings, server._stopping, http_stopped
                    )
                else:
                    http_stopped.set()
                if settings.grpc_port is not None:
                    server.grpc_address = await _start_grpc(nursery, engine, settings, find_models, grpc_scope)
                task_status.started(server)
                await server._stopping.wait()
                log.info("shutting down: in-flight requests have %.1f s to finish", settings.grace_period)
                grpc_scope.cancel()  # gRPC drains its calls (shielded, within the grace period)
                with trio.move_on_after(settings.grace_period + 1.0):
                    async with trio.open_nursery() as drain:
                        drain.start_soon(engine.aclose, settings.grace_period)
                        drain.start_soon(http_stopped.wait)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # e.g. a port in use: raise the OSError itself
        raise_single(group)
    log.info("actorserve stopped")


async def _serve_http(
    app: RestApp,
    settings: Settings,
    stopping: trio.Event,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn on the trio worker. ``stopping`` stops accepting and lets open
    connections finish within the grace period; ``stopped`` is set when it is done."""
    config = HypercornConfig()
    config.bind = [_bind(settings.host, settings.http_port or 0)]
    config.graceful_timeout = settings.grace_period
    config.accesslog = None  # no per-request logging on the hot path
    config.errorlog = logging.getLogger("hypercorn.error")
    try:
        async with trio.open_nursery() as nursery:
            serve_app = partial(hypercorn_serve, app, config, shutdown_trigger=stopping.wait)
            binds = await nursery.start(serve_app)
            task_status.started(_address(binds[0]))
    finally:
        stopped.set()


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _address(bind_url: str) -> Address:
    parts = urlsplit(bind_url)
    assert parts.hostname is not None and parts.port is not None, bind_url
    return parts.hostname, parts.port


async def _start_grpc(
    nursery: trio.Nursery, engine: Engine, settings: Settings, find_models: FindModels, scope: trio.CancelScope
) -> Address | None:
    """Start the gRPC transport in ``scope`` (cancelling it starts gRPC's own drain), or
    log why it is unavailable and return None."""
    try:
        from .transport.grpc import serve_grpc
    except ImportError as exc:
        log.warning("gRPC transport unavailable (%s): serving REST only", exc)
        return None

    async def run(*, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve_grpc(engine, settings, find_models=find_models, task_status=task_status)

    host, port = await nursery.start(run)
    return (str(host), int(port))
