"""Which HTTP protocol hypercorn's trio TCP server builds for a connection.

:func:`install` replaces the wrapper class that server uses with :class:`ProtocolWrapper`,
which acts only for a hypercorn ``Config`` marked by :func:`use_parser` (any other
hypercorn server in the process is untouched): HTTP/1.1 on :class:`.http1.HttpToolsProtocol`
or hypercorn's h11, HTTP/2 as hypercorn chooses, the end of every exchange shielded
(see :func:`_shielded_ends`), and, on plain TCP, every byte written straight into the
socket when the kernel takes it (:func:`.writes.direct_send`).
"""

from __future__ import annotations

import select
from collections.abc import Awaitable, Callable
from typing import Any, Final

import hypercorn.trio.tcp_server
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper as HypercornProtocolWrapper

from .http1 import HttpToolsProtocol
from .writes import direct_send, plain_socket

_MARK: Final = "_actorserve_http1"
#: bound on the end of an exchange under a shield (closing a socket is immediate)
_CLOSE_TIMEOUT: Final = 1.0


class ServerConfig(Config):
    """hypercorn's ``Config`` with :attr:`fixed_headers`, headers every response of the
    port carries beside ``date`` and ``server`` (``actorserve-replica``): written by the
    protocol with its own, so no response, error or refusal can lack them."""

    fixed_headers: tuple[tuple[bytes, bytes], ...] = ()

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        return [*super().response_headers(protocol), *self.fixed_headers]


def use_parser(config: Config, parser: str) -> None:
    """Serve HTTP/1.1 on servers started with ``config`` with ``parser``: "httptools"
    (:class:`HttpToolsProtocol`) or "h11" (hypercorn's ``H11Protocol``)."""
    setattr(config, _MARK, parser)


def install() -> None:
    """Make hypercorn's trio TCP server build its protocols with :class:`ProtocolWrapper`
    and time idle connections out with :func:`_idle_timeout`, run by an
    :class:`IdleTimer` (idempotent). Servers whose config is not marked keep hypercorn's
    own protocol classes."""
    hypercorn.trio.tcp_server.ProtocolWrapper = ProtocolWrapper  # type: ignore[attr-defined]
    hypercorn.trio.tcp_server.TCPServer._idle_timeout = _idle_timeout  # type: ignore[method-assign]
    hypercorn.trio.tcp_server.TrioSingleTask = IdleTimer  # type: ignore[assignment,attr-defined]


class IdleTimer:
    """hypercorn's ``TrioSingleTask`` for a connection's idle timeout (``restart``: arm it
    anew, ``stop``: disarm it), run by one task for the connection's life.

    hypercorn stops the timeout when a request starts and starts a new task for it when
    the response ends: a lock, a cancel and a ``nursery.start`` per request, about a tenth
    of a small unary request's CPU. Here ``restart`` and ``stop`` never wait: they cancel
    the timeout running now, if any, and the one task runs it again while armed. The
    protocol ends the task with :meth:`close` when the connection closes.

    Ordering: ``restart`` and ``stop`` come from different tasks (the end of a response
    from the app's task, the start of the next request from the connection's reading
    task), and each changes the armed state before its first checkpoint. So the state
    follows the calls in the order the protocol made its decisions; none of hypercorn's
    protocols (h11, HTTP/2) nor :class:`.http1.HttpToolsProtocol` passes a checkpoint
    between deciding "idle" or "busy" and the call (the wrappers in between, in this
    module and :mod:`.writes`, pass none either). When the update came after a
    checkpoint, a ``stop`` for the next request could land before the ``restart`` for the
    previous response's end, and the timeout closed the connection in the middle of the
    next request (docs/reliability.md#keep-alive-streams)."""

    __slots__ = ("_armed", "_closed", "_lot", "_running", "_scope")

    def __init__(self) -> None:
        self._armed = False
        self._closed = False
        self._running = False
        self._scope: trio.CancelScope | None = None
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def armed(self) -> bool:
        """The timeout runs (or is about to): the connection is idle and open."""
        return self._armed

    async def restart(self, task_group: Any, action: Callable[[], Awaitable[None]]) -> None:
        self._armed = not self._closed
        if self._scope is not None:
            self._scope.cancel()
        if not self._running and not self._closed:
            self._running = True
            task_group._nursery.start_soon(self._run, action)
        elif self._lot:
            self._lot.unpark()
        await _one_round()

    async def stop(self) -> None:
        self._armed = False
        if self._scope is not None:
            self._scope.cancel()
        await _one_round()

    def close(self) -> None:
        """The connection is closed: end the task (after the timeout running now, which
        ends with the connection)."""
        self._closed = True
        self._armed = False
        self._lot.unpark_all()

    async def _run(self, action: Callable[[], Awaitable[None]]) -> None:
        while not self._closed:
            if not self._armed:
                await self._lot.park()
                continue
            with trio.CancelScope() as self._scope:
                await action()
                return  # the timeout closed the connection
            self._scope = None  # restarted or stopped


async def _one_round() -> None:
    """One scheduler round after the timer's state changed, as hypercorn's lock gave: its
    HTTP/2 protocol has come to count on the app's task running there (a stream answered
    before its body is read is a KeyError in its event loop, which closes the
    connection). Only after the change: see :class:`IdleTimer` (ordering)."""
    await trio.lowlevel.checkpoint()


def _waiting_bytes(stream: object) -> bool:
    """Whether the client has sent bytes this process has not read yet (or closed): the
    socket under ``stream`` is readable. False if it cannot be told (e.g. TLS)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(readable)


async def _idle_timeout(self: Any) -> None:
    """hypercorn's idle timeout of a connection (armed when it is accepted and after each
    response, stopped when a request starts), with two changes:

    - if the client sent bytes since it was armed (read, or still waiting in the
      socket), it gets one more ``keep_alive_timeout`` before the close. Under load the
      server's loop reaches a new connection's request later than ``keep_alive_timeout``
      after accepting it, and closing the connection then lost a request that was sent
      in time (no answer); a client that trickles bytes still gets at most twice the
      timeout;
    - once the client has closed its side, the connection closes at once instead of
      waiting out the timeout (hypercorn's connection task, and its socket, outlived
      every client that hung up by ``keep_alive_timeout``)."""
    protocol = self.protocol
    ours = isinstance(protocol, ProtocolWrapper)
    if ours:
        protocol.bytes_seen = False
    extended = False
    while not (ours and protocol.client_closed):
        with trio.move_on_after(self.config.keep_alive_timeout) as scope:
            if ours:
                protocol.idle_scope = scope
            await self.context.terminated.wait()
            break
        if ours and protocol.client_closed:
            break
        seen = (ours and protocol.bytes_seen) or _waiting_bytes(self.stream)
        if extended or not seen:
            break
        extended = True
    with trio.CancelScope(shield=True):
        await self._initiate_server_close()


def _shielded_ends(send: Callable[[Event], Awaitable[None]]) -> Callable[[Event], Awaitable[None]]:
    """``send`` with the end of an exchange shielded from the caller's cancellation.

    A protocol closes the connection (``Connection: close``, HTTP/1.0), or arms the
    keep-alive timeout (``Updated(idle=True)``), from the task of the ASGI app that
    finished the response, and quart-trio and our raw paths cancel that task's scope as
    it finishes: hypercorn's close then dies at its first checkpoint and the socket stays
    open until the client gives up, and an idle keep-alive connection is never timed out.
    Shielded, with a bound (both are immediate)."""

    async def send_shielded_ends(event: Event) -> None:
        if isinstance(event, Closed) or (isinstance(event, Updated) and event.idle):
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                await send(event)
        else:
            await send(event)

    return send_shielded_ends


class ProtocolWrapper(HypercornProtocolWrapper):
    """hypercorn's wrapper (HTTP/2 by ALPN or prior knowledge, HTTP/1.1 otherwise), with
    HTTP/1.1 on httptools when the config asks for it, and for every protocol of a marked
    config the close shielded and, on plain TCP, the bytes written directly."""

    def __init__(
        self,
        app: Any,
        config: Config,
        context: Any,
        task_group: Any,
        state: Any,
        ssl: bool,
        client: Any,
        server: Any,
        send: Callable[[Event], Awaitable[None]],
        alpn_protocol: str | None = None,
    ) -> None:
        #: the client sent bytes since the idle timeout was last armed (:func:`_idle_timeout`)
        self.bytes_seen = False
        #: the connection is closed (the client hung up, or the server closed it)
        self.client_closed = False
        #: the scope of the idle timeout running now, if any (a close ends it at once)
        self.idle_scope: trio.CancelScope | None = None
        # the connection's idle timer (hypercorn's TCP server is the send method's owner)
        timer = getattr(getattr(send, "__self__", None), "idle_task", None)
        self._idle_timer = timer if isinstance(timer, IdleTimer) else None
        parser = getattr(config, _MARK, None)
        sock = plain_socket(send)  # before the wrapping below hides hypercorn's server
        if parser is not None:
            send = _shielded_ends(send)
            if sock is not None:  # every protocol of the connection writes through one writer
                send = direct_send(send, sock)
        if alpn_protocol == "h2" or parser != "httptools":
            super().__init__(
                app, config, context, task_group, state, ssl, client, server, send, alpn_protocol
            )
            return
        # the attributes hypercorn's wrapper keeps (its handle() switches to HTTP/2 with them)
        self.app, self.config, self.context, self.task_group = app, config, context, task_group
        self.ssl, self.client, self.server, self.send, self.state = ssl, client, server, send, state
        self.protocol = HttpToolsProtocol(  # type: ignore[assignment]
            app, config, context, task_group, state, ssl, client, server, send
        )

    async def handle(self, event: Event) -> None:
        if isinstance(event, RawData) and event.data:
            self.bytes_seen = True
        elif isinstance(event, Closed):
            self.client_closed = True
            if self.idle_scope is not None:
                self.idle_scope.cancel()
            if self._idle_timer is not None:
                self._idle_timer.close()
        await super().handle(event)


__all__ = ["IdleTimer", "ProtocolWrapper", "install", "use_parser"]
