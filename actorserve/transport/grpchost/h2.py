"""Everything that reaches into grpclib's private API, in one place with :mod:`.deadlines`,
:mod:`.wire` and :mod:`.unary` (grpclib 0.4.9).

grpclib lacks six things (one in :mod:`.metadata`, one in :mod:`.wire`) this transport
needs, and adds them here:

- :class:`GrpclibServer` keeps each call's request headers (grpclib drops
  ``grpc-encoding`` / ``grpc-accept-encoding``) and its connections (so a drain can
  close them);
- each connection gets an idle timeout and a read timeout, :class:`.deadlines.Deadlines`
  (grpclib has neither: a client that sent nothing, or half a frame, held its
  connection forever);
- :class:`.wire.Wire` reads and writes a call's messages, compressed ones too;
- every response's headers carry the server's fixed initial metadata (the replica's
  name) and any a call adds (:func:`.metadata.add_initial_metadata`), errors included;
- a unary call of a method that uses only :class:`.wire.Wire` is served by the lean path
  (:mod:`.unary`) instead of grpclib's ``request_handler``;
- each connection's transport is wrapped in :class:`.writes.CoalescedWrites`, so what
  grpclib writes to it in one turn of the event loop (response headers, DATA, trailers,
  of every stream) goes out in one socket write (grpclib writes each as it goes: two or
  three ``send`` calls per unary call).

Everything here runs on grpclib's asyncio loop. (:class:`.wire.Wire` and its framing
are re-exported here, where the doors import them from.)
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

from grpclib.protocol import H2Protocol
from grpclib.server import Server
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError

from .deadlines import Deadlines
from .metadata import with_initial_metadata
from .unary import lean_call, serve_unary
from .wire import ACCEPT_ENCODING, PREFIX, WRITE_CHUNK, Wire, frame_messages
from .writes import CoalescedWrites


class GrpclibServer(Server):
    """grpclib's server, plus what it lacks for us: the request headers of a call (read
    by :class:`Wire`), the connections, so shutdown can close them, and each
    connection's deadlines: with no open stream for ``idle_timeout`` seconds it gets
    GOAWAY (NO_ERROR) and is closed; a frame (or the connection preface) started but
    not finished within ``read_timeout`` seconds ends it the same way. 0 turns either
    off."""

    def __init__(
        self,
        handlers: list[Any],
        *,
        idle_timeout: float = 0.0,
        read_timeout: float = 0.0,
        fixed_metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(handlers)
        #: initial metadata of every response, an error's trailers-only one included
        #: (``actorserve-replica``); a call adds its own with :func:`add_initial_metadata`
        self.fixed_metadata = tuple(fixed_metadata)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout

    def _protocol_factory(self) -> H2Protocol:
        protocol: H2Protocol = super()._protocol_factory()
        handler: Any = protocol.handler  # grpclib.server.Handler: its mapping and task table
        accept = handler.accept
        deadlines = Deadlines(protocol, self.idle_timeout, self.read_timeout)

        fixed = self.fixed_metadata
        loop = asyncio.get_running_loop()

        def accept_keeping_headers(stream: Any, headers: Any, release_stream: Any) -> None:
            stream.headers = headers  # the attribute the client side uses for response headers
            if fixed:
                with_initial_metadata(stream, fixed)
            deadlines.opened()

            def release() -> None:
                release_stream()
                deadlines.released()

            call = lean_call(handler.mapping, headers)
            if call is None:
                accept(stream, headers, release)
                return
            # grpclib's Handler.accept, with the lean path's coroutine: its task table is
            # what cancels the call on RST_STREAM and on close
            handler.__gc_step__()
            handler._tasks[stream] = loop.create_task(serve_unary(*call, stream, release))

        handler.accept = accept_keeping_headers
        received, made, lost = protocol.data_received, protocol.connection_made, protocol.connection_lost

        def data_received_checked(data: bytes) -> None:
            _flush_goaway_on_protocol_errors(protocol)
            received(data)
            _refuse_overlong_frame(protocol)
            deadlines.received(len(data))

        def connection_made(transport: Any) -> None:
            made(CoalescedWrites(transport))  # type: ignore[arg-type]  # a transport in all grpclib uses
            deadlines.released()  # idle from the start: no stream yet

        def connection_lost(exc: BaseException | None) -> None:
            deadlines.stop()
            lost(exc)

        protocol.data_received = data_received_checked  # type: ignore[method-assign]
        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        self._protocols.add(protocol)
        return protocol

    def stop_listening(self) -> None:
        """Close the listening socket; calls on open connections go on."""
        if self._server is not None:
            self._server.close()

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None and not connection.is_closing():
                connection.close()


def _flush_goaway_on_protocol_errors(protocol: H2Protocol) -> None:
    """Send the GOAWAY h2 queues when a frame breaks HTTP/2: grpclib closes the socket
    on h2's ProtocolError without writing it, so the client saw a bare close."""
    connection = getattr(protocol, "connection", None)
    if connection is None or getattr(connection, "_actorserve_flushes", False):
        return
    feed = connection.feed

    def feed_flushing(data: bytes) -> Any:
        try:
            return feed(data)
        except ProtocolError:
            connection.flush()
            raise

    connection.feed = feed_flushing
    connection._actorserve_flushes = True


def _refuse_overlong_frame(protocol: H2Protocol) -> None:
    """End the connection with GOAWAY FRAME_SIZE_ERROR as soon as the frame waiting in
    its buffer announces more than SETTINGS_MAX_FRAME_SIZE: h2 checks the length only
    once the whole frame has arrived, so a client announcing 16 MiB and sending a few
    bytes held the connection (and up to 16 MiB of buffer) for as long as it liked."""
    connection = getattr(protocol, "connection", None)
    if connection is None or connection.is_closing():
        return
    h2 = connection._connection
    buffer = h2.incoming_buffer
    pending = buffer._data
    if buffer._preamble_len or len(pending) < 9:
        return
    length = int.from_bytes(pending[:3], "big")
    if length > h2.max_inbound_frame_size:
        h2.close_connection(error_code=ErrorCodes.FRAME_SIZE_ERROR, additional_data=b"frame too large")
        connection.flush()
        protocol.processor.close("frame too large")


__all__ = [
    "ACCEPT_ENCODING",
    "PREFIX",
    "WRITE_CHUNK",
    "GrpclibServer",
    "Wire",
    "frame_messages",
]
