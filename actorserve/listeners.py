"""The listening sockets of a server, bound before anything else starts.

Plain :class:`socket.socket` objects (no hypercorn or grpclib types), so the same sockets
can be served in this process or inherited by front processes (``--api-workers``).
"""

from __future__ import annotations

import logging
import socket

import attrs

from .settings import Settings

log = logging.getLogger("actorserve.processes")


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


def log_addresses(listeners: Listeners, fronts: int) -> None:
    """Log where the multi-process server listens (the parent, once every child is up)."""
    if listeners.grpc is not None:
        host, port = listeners.grpc.getsockname()[:2]
        log.info("gRPC listening on %s:%d", host, port)
    if listeners.http is not None:
        host, port = listeners.http.getsockname()[:2]
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        browsable = url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")
        log.info("REST listening on %s (playground: %s/)", url, browsable)
    log.info("serving with %d front process(es) and one engine process", fronts)
