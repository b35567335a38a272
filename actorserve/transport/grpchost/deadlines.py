"""Idle and read timeouts for a gRPC connection (grpclib has neither), on grpclib's
asyncio loop. Like :mod:`.h2`, it reads grpclib's and h2's private state (grpclib
0.4.9, h2 4.x): the streams grpclib has open, and h2's buffer of unparsed bytes."""

from __future__ import annotations

import asyncio
import logging

from grpclib.protocol import H2Protocol
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError

log = logging.getLogger("actorserve.transport.grpc")


class Deadlines:
    """One connection's idle and read timeouts (see :class:`.h2.GrpclibServer`, which
    installs it), as timers on grpclib's loop.

    Idle is counted, as grpc-go's ``MaxConnectionIdle`` counts it, from the connection's
    start or the moment its last open stream ended: pings and settings do not reset it,
    and an open stream (a long bidi stream that is quiet for minutes) keeps the
    connection. The read timer runs while h2's buffer holds part of a frame (or of the
    preface), from when that frame began to arrive: trickling it byte by byte does not
    restart it, finishing it does."""

    __slots__ = ("_fed", "_idle", "_mark", "_partial", "idle_timeout", "protocol", "read_timeout")

    def __init__(self, protocol: H2Protocol, idle_timeout: float, read_timeout: float) -> None:
        self.protocol = protocol
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self._idle: asyncio.TimerHandle | None = None
        self._partial: asyncio.TimerHandle | None = None
        self._fed = 0  # bytes received so far
        self._mark = -1  # where the frame being timed began (in bytes received)

    def opened(self) -> None:
        """A stream opened: no idle timer while one is open."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def released(self) -> None:
        """A stream ended (or the connection began): idle from now if none is open."""
        protocol = self.protocol
        if not self.idle_timeout or self._idle is not None or protocol.connection.is_closing():
            return
        if not protocol.processor.streams:
            loop = asyncio.get_event_loop()
            self._idle = loop.call_later(self.idle_timeout, self._expire, "idle", self.idle_timeout)

    def received(self, size: int) -> None:
        """After each read: time the frame left unfinished in h2's buffer, if any."""
        self._fed += size
        connection = self.protocol.connection
        if not self.read_timeout or connection.is_closing():
            return
        buffer = connection._connection.incoming_buffer
        if buffer._preamble_len:  # part of the preface came (size > 0 got us here)
            pending, mark = True, 0
        else:
            pending, mark = bool(buffer._data), self._fed - len(buffer._data)
        if pending and self._partial is not None and mark == self._mark:
            return  # the same frame, still coming
        if self._partial is not None:
            self._partial.cancel()
            self._partial = None
        if pending:
            self._mark = mark
            loop = asyncio.get_event_loop()
            self._partial = loop.call_later(self.read_timeout, self._expire, "read", self.read_timeout)

    def stop(self) -> None:
        for handle in (self._idle, self._partial):
            if handle is not None:
                handle.cancel()
        self._idle = self._partial = None

    def _expire(self, which: str, seconds: float) -> None:
        if which == "idle":
            self._idle = None
            if self.protocol.processor.streams:
                return  # a stream opened in the same loop turn
            reason = f"idle: no open stream for {seconds:g} s (grpc_idle_timeout)"
        else:
            self._partial = None
            reason = f"a frame did not arrive within {seconds:g} s (read_timeout)"
        self.stop()
        connection = self.protocol.connection
        if connection.is_closing():
            return
        try:
            connection._connection.close_connection(
                error_code=ErrorCodes.NO_ERROR, additional_data=reason.encode()
            )
            connection.flush()
        except ProtocolError:
            pass  # h2 already ended the connection: close the socket all the same
        log.debug("gRPC connection from %s closed: %s", connection.get_peer().addr(), reason)
        self.protocol.processor.close(reason)


__all__ = ["Deadlines"]
