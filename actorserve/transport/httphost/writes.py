"""A connection's writes without a scheduler round trip per write.

hypercorn writes every chunk with ``send_all`` under a lock: the lock and the socket
send are a trio checkpoint each, so a streamed event cost two trips through the
scheduler (and a task switch for every other task that ran meanwhile) even though the
socket took the bytes at once. :class:`DirectWriter` does what uvicorn does: it hands
the bytes to the kernel synchronously (a non-blocking ``send``), and only the part the
kernel did not take goes through hypercorn's ``send_all``, which waits until the socket
drains. The kernel's send buffer is the connection's bounded outbox: a producer whose
client reads slowly fills it and then waits in ``send_all`` (backpressure, as before),
while a producer whose bytes fit never yields for them.

Ordering: while a ``send_all`` of this connection is in flight (the buffer was full),
later writes queue behind it on the same path instead of going direct, so bytes leave
in the order written. Errors: a direct write that fails (the client reset or closed)
goes by ``send_all`` instead, which meets the same error and closes the connection as
hypercorn does. Cancellation: every write still starts with a cancellation point
(``checkpoint_if_cancelled``, as the lock's acquire was), so a client that hangs up
cancels its stream at the next write as promptly as before; and a producer that never
blocks elsewhere still yields every :data:`YIELD_EVERY` writes, so it cannot starve the
loop.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio
from hypercorn.events import Event, RawData

#: direct writes in a row after which the writer yields once to the scheduler anyway
YIELD_EVERY: Final = 32


def plain_socket(send: Callable[[Event], Awaitable[None]]) -> trio.socket.SocketType | None:
    """The socket under hypercorn's ``TCPServer.protocol_send`` (bound method), or None
    (TLS, or not hypercorn's trio server: every write then goes by ``send_all``)."""
    stream = getattr(getattr(send, "__self__", None), "stream", None)
    return stream.socket if isinstance(stream, trio.SocketStream) else None


class DirectWriter:
    """Writes for one connection: straight into ``sock`` when it takes them, else by
    ``send`` (hypercorn's ``RawData`` event, ``send_all`` under its lock)."""

    __slots__ = ("_in_flight", "_send", "_sock", "_unyielded")

    def __init__(self, send: Callable[[Event], Awaitable[None]], sock: Any) -> None:
        self._send = send
        self._sock = sock
        self._in_flight = 0  # sends by send_all not finished: direct writes would jump them
        self._unyielded = 0

    async def write(self, data: bytes) -> None:
        """Write ``data`` after every byte written before it; :class:`trio.Cancelled`
        before any of it is written when the caller is cancelled."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._sock is not None and not self._in_flight:
            fileno = self._sock.fileno()  # -1 once trio closed it (never a reused number)
            sent = 0
            if fileno >= 0:
                try:
                    sent = os.write(fileno, data)
                except OSError:  # EAGAIN: full; else the connection broke (send_all says so)
                    sent = 0
            if sent == len(data):
                self._unyielded += 1
                if self._unyielded >= YIELD_EVERY:
                    self._unyielded = 0
                    # a yield that cannot raise: the bytes are out, the write succeeded
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return
            data = data[sent:]
        self._unyielded = 0
        self._in_flight += 1
        try:
            await self._send(RawData(data=data))
        finally:
            self._in_flight -= 1


def direct_send(send: Callable[[Event], Awaitable[None]], sock: Any) -> Callable[[Event], Awaitable[None]]:
    """``send`` (hypercorn's, for one connection) with its ``RawData`` written by one
    :class:`DirectWriter`: what every protocol of the connection (HTTP/1.1 or HTTP/2)
    is given, so all of its bytes go the same way, in order."""
    writer = DirectWriter(send, sock)
    write = writer.write

    async def send_direct(event: Event) -> None:
        if isinstance(event, RawData):
            await write(event.data)
        else:
            await send(event)

    return send_direct


__all__ = ["YIELD_EVERY", "DirectWriter", "direct_send", "plain_socket"]
