"""``serve``: the engine, the REST transport (quart-trio on hypercorn's trio worker) and
the gRPC transport, in one nursery.

::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(actorserve.serve, settings)
        ...  # server.http_url, server.engine
        server.shutdown()        # graceful: drain, then stop (or cancel the nursery)

Startup, in a fixed order: bind the listening sockets (:func:`open_listeners`; a port in
use fails here, before any model loads), load every model, then serve.

Shutdown, in a fixed order: stop accepting connections and requests, give in-flight
requests ``Settings.grace_period`` seconds, then cancel whatever is left (every sequence
ends with reason ``shutdown``). Cancelling the surrounding scope skips the grace period.
"""

from __future__ import annotations

import logging
import socket
from functools import partial

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets as HypercornSockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from .engine import Engine, open_engine, raise_single
from .repository import ModelRepository
from .settings import Settings, builtin_models
from .transport.rest import FindModels, RestApp, create_app

log = logging.getLogger(__name__)

Address = tuple[str, int]


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


class ListenError(OSError):
    """A listening socket could not be opened. ``str()`` names the address and the
    transport: ``cannot listen on 127.0.0.1:8080 (REST): address already in use``;
    ``errno`` is the underlying error's."""

    def __init__(self, transport: str, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.transport = transport
        self.host = host
        self.port = port

    def __str__(self) -> str:
        reason = str(self.strerror)
        return f"cannot listen on {_host_port(self.host, self.port)} ({self.transport}): {reason[:1].lower()}{reason[1:]}"


@attrs.frozen
class Listeners:
    """The bound, listening sockets of a server: REST and gRPC, each None when off.

    Plain :class:`socket.socket` objects, so they can be handed to another process. Whoever
    holds a ``Listeners`` owns the sockets until it passes them to :func:`serve`, which then
    owns them and closes them when it returns (the transports serve on them, or on
    duplicates of them, and never close them first, except hypercorn when REST stops)."""

    http: socket.socket | None = None
    grpc: socket.socket | None = None

    def close(self) -> None:
        for sock in (self.http, self.grpc):
            if sock is not None:
                sock.close()


#: pending connections each listening socket queues before the server accepts them.
BACKLOG = 128


def open_listeners(settings: Settings) -> Listeners:
    """Bind and listen on ``settings.host`` at ``http_port`` (REST) and ``grpc_port``
    (gRPC); a port that is None gets no socket, port 0 a free one.

    Raises :class:`ListenError` naming the address and transport (a port in use, an
    address that is not this machine's, a host name that does not resolve); nothing is
    left open then. The caller owns the sockets (see :class:`Listeners`)."""
    http = _listen(settings.host, settings.http_port, "REST") if settings.http_port is not None else None
    try:
        grpc = _listen(settings.host, settings.grpc_port, "gRPC") if settings.grpc_port is not None else None
    except BaseException:
        if http is not None:
            http.close()
        raise
    return Listeners(http, grpc)


def _listen(host: str, port: int, transport: str) -> socket.socket:
    try:
        # IPPROTO_TCP explicitly: asyncio (gRPC) sets TCP_NODELAY only on sockets whose
        # proto says TCP; without it every call waits ~40 ms for Nagle + delayed ACKs.
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ListenError(transport, host, port, exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(transport, host, port, exc) from None
    except BaseException:
        sock.close()
        raise
    return sock


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(
    settings: Settings | None = None,
    *,
    repository: ModelRepository | None = None,
    listeners: Listeners | None = None,
    rest_fast_path: bool = True,
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
    ``rest_fast_path=False`` serves ``infer`` through Quart too (for comparisons)."""
    if settings is None:
        settings = Settings(models=tuple(builtin_models()))
    if listeners is None:
        listeners = open_listeners(settings)
    repository = repository or ModelRepository()
    find_models: FindModels = partial(repository.find, known=settings.models)
    try:
        async with open_engine(settings, repository=repository) as engine:
            server = Server(engine, settings)
            http_stopped = trio.Event()
            grpc_scope = trio.CancelScope()
            async with trio.open_nursery() as nursery:
                if listeners.http is not None:
                    app = create_app(engine, settings, find_models=find_models, fast_path=rest_fast_path)
                    server.http_address = await nursery.start(
                        _serve_http, app, listeners.http, settings, server._stopping, http_stopped
                    )
                else:
                    http_stopped.set()
                if listeners.grpc is not None:
                    server.grpc_address = await _start_grpc(
                        nursery, engine, settings, listeners.grpc, grpc_scope
                    )
                if server.http_url is not None:
                    log.info("REST listening on %s (playground: %s/)", server.http_url, _browsable(server.http_url))
                task_status.started(server)
                await server._stopping.wait()
                log.info("shutting down: in-flight requests have %.1f s to finish", settings.grace_period)
                grpc_scope.cancel()  # gRPC drains its calls (shielded, within the grace period)
                with trio.move_on_after(settings.grace_period + 1.0):
                    async with trio.open_nursery() as drain:
                        drain.start_soon(engine.aclose, settings.grace_period)
                        drain.start_soon(http_stopped.wait)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # e.g. a model that fails to load: raise it itself
        raise_single(group)
    finally:
        listeners.close()
    log.info("actorserve stopped")


async def _serve_http(
    app: RestApp,
    sock: socket.socket,
    settings: Settings,
    stopping: trio.Event,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn's trio worker on the listening socket ``sock``. ``stopping`` stops
    accepting and lets open connections finish within the grace period; ``stopped`` is
    set when it is done."""
    config = HypercornConfig()
    config.graceful_timeout = settings.grace_period
    config.accesslog = None  # no per-request logging on the hot path
    config.errorlog = logging.getLogger("hypercorn.error")
    try:
        async with trio.open_nursery() as nursery:
            # hypercorn.trio.serve() without its own binding: worker_serve takes our socket
            serve_app = partial(
                worker_serve,
                wrap_app(app, config.wsgi_max_body_size, None),
                config,
                sockets=HypercornSockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[]),
                shutdown_trigger=stopping.wait,
            )
            await nursery.start(serve_app)
            host, port = sock.getsockname()[:2]
            task_status.started((str(host), int(port)))
    finally:
        stopped.set()


def _browsable(url: str) -> str:
    """``url`` with a wildcard host (every interface) replaced by loopback, for a browser."""
    return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")


async def _start_grpc(
    nursery: trio.Nursery,
    engine: Engine,
    settings: Settings,
    sock: socket.socket,
    scope: trio.CancelScope,
) -> Address | None:
    """Start the gRPC transport on ``sock`` in ``scope`` (cancelling it starts gRPC's own
    drain), or log why it is unavailable and return None."""
    try:
        from .transport.grpc import serve_grpc
    except ImportError as exc:
        log.warning("gRPC transport unavailable (%s): serving REST only", exc)
        sock.close()  # refuse connections rather than leave them waiting in the backlog
        return None

    async def run(*, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve_grpc(engine, settings, sock=sock, task_status=task_status)

    host, port = await nursery.start(run)
    return (str(host), int(port))
