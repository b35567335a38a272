"""The listening sockets of a server, bound before anything else starts.

Plain :class:`socket.socket` objects (no hypercorn or grpclib types), so the same sockets
can be served in this process or inherited by front processes (``--api-workers``).
"""

from __future__ import annotations

import logging
import os
import resource
import socket
from pathlib import Path
from typing import Final

import attrs

from ..addresses import BACKLOG, PORTS, browsable, host_port, http_url, log_extra_address
from ..settings import Settings

log = logging.getLogger("actorserve.server.processes")


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
        return f"cannot listen on {host_port(self.host, self.port)} ({self.transport}): {reason[:1].lower()}{reason[1:]}"


@attrs.frozen
class Listeners:
    """The bound, listening sockets of a server, each None when off: REST and gRPC, and
    the extra TorchServe ports (only its gRPC inference service, only its gRPC management
    service, only its management REST paths).

    Plain :class:`socket.socket` objects, so they can be handed to another process. Whoever
    holds a ``Listeners`` owns the sockets until it passes them to :func:`serve`, which then
    owns them and closes them when it returns (the transports serve on them, or on
    duplicates of them, and never close them first, except hypercorn when REST stops)."""

    http: socket.socket | None = None
    grpc: socket.socket | None = None
    ts_inference_grpc: socket.socket | None = None
    ts_management_grpc: socket.socket | None = None
    ts_management_http: socket.socket | None = None

    def sockets(self) -> dict[str, socket.socket]:
        """The open ones, by field name."""
        return {name: sock for name, sock in attrs.asdict(self, recurse=False).items() if sock is not None}

    def close(self) -> None:
        for sock in self.sockets().values():
            sock.close()

    def for_child(self) -> dict[str, int]:
        """``{variable: file descriptor}`` to hand the open sockets to a child process
        (which rebuilds them with :meth:`inherited`)."""
        return {_fd_variable(name): sock.fileno() for name, sock in self.sockets().items()}

    @classmethod
    def inherited(cls) -> Listeners:
        """The listening sockets the parent passed (:meth:`for_child`)."""
        fds = {name: os.environ.get(_fd_variable(name)) for name in PORTS}
        return cls(**{name: socket.socket(fileno=int(fd)) for name, fd in fds.items() if fd})


def _fd_variable(name: str) -> str:
    return f"_ACTORSERVE_{name.upper()}_FD"


_SOMAXCONN: Final = Path("/proc/sys/net/core/somaxconn")


def effective_backlog(backlog: int) -> int:
    """``backlog`` as the kernel applies it: capped by ``net.core.somaxconn`` (Linux)."""
    try:
        return min(backlog, int(_SOMAXCONN.read_text()))
    except (OSError, ValueError):
        return backlog


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (a surge of
    connections plus the models' files can pass the usual soft limit of 1,024); returns
    the soft limit now in force. Logged at debug; a refusal is logged, not raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        log.debug("open files: soft limit %d (the hard limit)", soft)
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:  # e.g. an unlimited hard limit above fs.nr_open
        log.debug("open files: soft limit stays %d (hard %d): %s", soft, hard, exc)
        return soft
    log.debug("open files: soft limit raised from %d to %d", soft, hard)
    return hard


def open_listeners(settings: Settings) -> Listeners:
    """Bind and listen on ``settings.host`` at ``http_port`` (REST), ``grpc_port`` (gRPC)
    and the extra TorchServe ports (:data:`PORTS`), each with ``settings.backlog``; a
    port that is None gets no socket, port 0 a free one.

    Raises :class:`ListenError` naming the address and transport (a port in use, an
    address that is not this machine's, a host name that does not resolve); nothing is
    left open then. The caller owns the sockets (see :class:`Listeners`)."""
    opened: dict[str, socket.socket] = {}
    try:
        for name, (setting, transport) in PORTS.items():
            port = getattr(settings, setting)
            if port is not None:
                opened[name] = _listen(settings.host, port, transport, settings.backlog)
    except BaseException:
        for sock in opened.values():
            sock.close()
        raise
    if opened:
        log.debug(
            "listen backlog %d (net.core.somaxconn allows %d)",
            settings.backlog,
            effective_backlog(settings.backlog),
        )
    return Listeners(**opened)


def _listen(host: str, port: int, transport: str, backlog: int = BACKLOG) -> socket.socket:
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
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(transport, host, port, exc) from None
    except BaseException:
        sock.close()
        raise
    return sock


def log_addresses(listeners: Listeners, fronts: int) -> None:
    """Log where the multi-process server listens (the parent, once every child is up)."""
    if listeners.grpc is not None:
        host, port = listeners.grpc.getsockname()[:2]
        log.info("gRPC listening on %s:%d", host, port)
    if listeners.http is not None:
        url = http_url(*listeners.http.getsockname()[:2])
        log.info("REST listening on %s (playground: %s/)", url, browsable(url))
    for name, sock in listeners.sockets().items():
        if name.startswith("ts_"):
            log_extra_address(name, *sock.getsockname()[:2])
    log.info("serving with %d front process(es) and one engine process", fronts)
