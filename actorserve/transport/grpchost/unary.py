"""The lean path of a unary gRPC call: the method's handler run on a small stand-in for
grpclib's server ``Stream``, without grpclib's ``request_handler`` (grpclib 0.4.9).

grpclib serves each call through ``request_handler``: a ``Stream`` with its codec, its
event dispatch (``recv_request``, ``send_trailing_metadata``: no listener here, a
coroutine each all the same), a ``Wrapper`` or ``DeadlineWrapper`` context and, at the
end, trailers built through a ``MultiDict``. A door's method that reads and writes only
through :class:`.wire.Wire` (declared with :func:`lean`) needs none of that: for such a
unary-unary method, :func:`lean_call` checks the request headers as ``request_handler``
does and :func:`serve_unary` runs the same handler (token check, record, drain, all the
host's wrappers) on a :class:`UnaryStream`, then sends the trailers. A call whose
headers are anything but the plain case (a method that is not lean, a bad content-type,
a bad ``grpc-timeout``, metadata that does not decode) goes to ``request_handler`` as
before, which answers with its own errors. The reply's headers and the OK trailers are
fixed HPACK blocks (:data:`RESPONSE_HEADERS`, :data:`OK_TRAILERS`, :func:`literal`),
each written as one HEADERS frame by :func:`send_header_block`, not encoded by h2.

What a call sees is what it saw under grpclib: the deadline (``grpc-timeout``) ends the
handler with DEADLINE_EXCEEDED; a ``GRPCError`` is its status and message (trailers-only
when no header went out), then RST_STREAM; any other exception is logged and answered
UNKNOWN "Internal Server Error"; a RST_STREAM from the client (grpclib's
``Handler.cancel``, which finds the task here too) cancels the handler, which cancels
its trio task. Runs on grpclib's asyncio loop; tested in ``tests/transport/grpchost/test_grpc_unary.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import types
from collections.abc import Awaitable, Callable
from typing import Any, Final

import h2.exceptions
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import Deadline, decode_metadata, encode_grpc_message
from h2.connection import ConnectionInputs
from h2.stream import StreamInputs
from hpack import Decoder
from hpack.hpack import encode_integer

log = logging.getLogger("actorserve.transport.grpc")

#: the content types grpclib's proto codec takes (``request_handler``'s check)
CONTENT_TYPES: Final = frozenset({"application/grpc", "application/grpc+proto"})
#: the content type of a response, as grpclib's ``Stream`` sends it
CONTENT_TYPE: Final = "application/grpc+proto"
#: the attribute :func:`lean` sets on a handler function
_LEAN: Final = "__actorserve_lean__"

_Func = Callable[[Any], Awaitable[None]]


def lean(func: _Func) -> _Func:
    """Mark ``func`` (a unary-unary handler function) as one that reads its request and
    writes its reply only through :class:`.wire.Wire`, never with grpclib's
    ``recv_message`` / ``send_message``: the lean path may serve it. Wrappers that keep
    the mark pass it on with :func:`keep_lean`."""
    if isinstance(func, types.MethodType):  # a bound method takes no attribute: a partial does
        func = functools.partial(func)
    setattr(func, _LEAN, True)
    return func


def is_lean(func: _Func) -> bool:
    return getattr(func, _LEAN, False) is True


def keep_lean(wrapped: _Func, wrapper: _Func) -> _Func:
    """``wrapper``, marked :func:`lean` when ``wrapped`` is."""
    return lean(wrapper) if is_lean(wrapped) else wrapper


class UnaryStream:
    """What the handlers of lean methods use of grpclib's server ``Stream``: the
    request's metadata, the HTTP/2 stream (``_stream``, read and written by
    :class:`.wire.Wire`) and the flags grpclib keeps (initial metadata sent, message
    sent). Made by :func:`serve_unary` for one call."""

    __slots__ = (
        "_messages_sent",
        "_send_initial_metadata_done",
        "_send_message_done",
        "_stream",
        "deadline",
        "metadata",
    )

    _content_type: Final = CONTENT_TYPE

    def __init__(self, h2_stream: Any, metadata: Any, deadline: Deadline | None) -> None:
        self._stream = h2_stream
        self.metadata = metadata
        self.deadline = deadline
        self._send_initial_metadata_done = False
        self._send_message_done = False
        self._messages_sent = 0

    async def send_initial_metadata(self) -> None:
        """The response headers, with the server's initial metadata (see :mod:`.metadata`):
        one HEADERS frame from :data:`RESPONSE_HEADERS` and the metadata's literals."""
        h2_stream = self._stream
        extra = getattr(h2_stream, "initial_metadata", ())
        block = RESPONSE_HEADERS + b"".join(literal(key, value) for key, value in extra)
        await send_header_block(h2_stream, block, end_stream=False)
        self._send_initial_metadata_done = True


def literal(name: str, value: str, index: int = 0) -> bytes:
    """One HPACK field "literal without indexing" (RFC 7541 6.2.2): its name by static
    ``index``, or spelled out when 0. It adds nothing to the dynamic table, so a block
    of them reads the same on every connection and leaves h2's encoder as it was."""
    out = bytearray(encode_integer(index, 4))  # 0000xxxx
    if not index:
        raw = name.encode()
        out += encode_integer(len(raw), 7) + raw
    raw = value.encode()
    out += encode_integer(len(raw), 7) + raw
    return bytes(out)


#: ``:status: 200`` (static index 8) and ``content-type`` (static name 31): every OK reply's
RESPONSE_HEADERS: Final = b"\x88" + literal("content-type", CONTENT_TYPE, 31)
#: the trailers of every OK call
OK_TRAILERS: Final = literal("grpc-status", "0")
_HEADERS_FLAGS: Final = (0x4, 0x4 | 0x1)  # END_HEADERS, and END_STREAM with it


async def send_header_block(h2_stream: Any, block: bytes, *, end_stream: bool) -> None:
    """One HEADERS frame holding ``block`` (HPACK that uses no dynamic table, see
    :func:`literal`) on grpclib's HTTP/2 stream, with h2's state moved as its
    ``send_headers`` moves it; the bytes go to the transport (coalesced per loop turn).
    A block over the peer's frame size goes through h2 itself, decoded back to headers.
    ``StreamClosedError`` when h2 has dropped the stream, as grpclib's ``send_headers``."""
    connection = h2_stream.connection
    if not connection.write_ready.is_set():
        await connection.write_ready.wait()
    h2_connection = h2_stream._h2_connection
    stream_id = h2_stream.id
    stream = h2_connection.streams.get(stream_id)
    if stream is None:
        raise h2.exceptions.StreamClosedError(stream_id)
    if len(block) > h2_connection.max_outbound_frame_size:
        headers = Decoder().decode(block)
        h2_connection.send_headers(stream_id, headers, end_stream=end_stream)
    else:
        h2_connection.state_machine.process_input(ConnectionInputs.SEND_HEADERS)
        stream.state_machine.process_input(StreamInputs.SEND_HEADERS)
        if end_stream:
            stream.state_machine.process_input(StreamInputs.SEND_END_STREAM)
        h2_connection._data_to_send += (
            len(block).to_bytes(3, "big")
            + bytes((0x1, _HEADERS_FLAGS[end_stream]))  # type 1: HEADERS
            + stream_id.to_bytes(4, "big")
            + block
        )
    h2_stream._transport.write(h2_connection.data_to_send())
    connection.headers_send_process()


def lean_call(
    mapping: dict[str, Handler], headers: list[tuple[str, str]]
) -> tuple[_Func, Any, Deadline | None] | None:
    """``(handler function, metadata, deadline)`` (the first arguments of
    :func:`serve_unary`) when the lean path serves the call
    with these request ``headers``; None when grpclib's ``request_handler`` must (see
    the module docstring)."""
    fields = dict(headers)
    method = mapping.get(fields.get(":path", ""))
    if (
        method is None
        or method.cardinality is not Cardinality.UNARY_UNARY
        or not is_lean(method.func)
        or fields.get(":method") != "POST"
        or fields.get("content-type") not in CONTENT_TYPES
        or fields.get("te") != "trailers"
    ):
        return None
    try:
        deadline = Deadline.from_headers(headers) if "grpc-timeout" in fields else None
        metadata = decode_metadata(headers)
    except Exception:  # grpclib answers a bad grpc-timeout, and logs bad -bin metadata
        return None
    return method.func, metadata, deadline


async def serve_unary(
    func: _Func, metadata: Any, deadline: Deadline | None, h2_stream: Any, release_stream: Callable[[], None]
) -> None:
    """Run ``func`` for one unary call on HTTP/2 stream ``h2_stream`` and end the call
    with its trailers (see the module docstring); ``release_stream`` at the end, always.
    Runs as the call's own asyncio task (grpclib's ``Handler`` cancels it on RST_STREAM
    and on close)."""
    stream = UnaryStream(h2_stream, metadata, deadline)
    task = asyncio.current_task()
    timer: asyncio.TimerHandle | None = None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        if task is not None:
            task.cancel()

    status, message = Status.OK, None
    try:
        try:
            if deadline is not None:
                remaining = deadline.time_remaining()
                if not remaining:
                    raise GRPCError(Status.DEADLINE_EXCEEDED)
                timer = asyncio.get_running_loop().call_later(remaining, expire)
            try:
                await func(stream)
            finally:
                if timer is not None:
                    timer.cancel()
        except GRPCError as exc:
            status, message = exc.status, exc.message
        except asyncio.CancelledError:
            if not expired or task is None:
                raise  # the client reset the stream, or the connection closed: no answer
            task.uncancel()
            log.info("Deadline exceeded")
            status, message = Status.DEADLINE_EXCEEDED, None
        except Exception:
            log.exception("Application error")
            status, message = Status.UNKNOWN, "Internal Server Error"
        if status is Status.OK and not stream._send_message_done:
            log.error("Unary response with OK status requires a single message to be sent")
            status, message = Status.UNKNOWN, "Internal Server Error"
        await _send_trailers(stream, status, message)
    finally:
        release_stream()


async def _send_trailers(stream: UnaryStream, status: Status, message: str | None) -> None:
    """The call's trailers (trailers-only when no header went out), as grpclib's
    ``send_trailing_metadata`` sends them; RST_STREAM after an error."""
    h2_stream = stream._stream
    if h2_stream._transport.is_closing():
        return
    if status is Status.OK and stream._send_initial_metadata_done:
        try:
            await send_header_block(h2_stream, OK_TRAILERS, end_stream=True)
        except h2.exceptions.StreamClosedError:
            pass
        return
    headers = (
        [] if stream._send_initial_metadata_done else [(":status", "200"), ("content-type", CONTENT_TYPE)]
    )
    headers.append(("grpc-status", str(status.value)))
    if message is not None:
        headers.append(("grpc-message", encode_grpc_message(message)))
    try:
        await h2_stream.send_headers(headers, end_stream=True)
    except h2.exceptions.StreamClosedError:
        return
    if status is not Status.OK and h2_stream.closable:
        h2_stream.reset_nowait()


__all__ = ["CONTENT_TYPE", "UnaryStream", "is_lean", "keep_lean", "lean", "lean_call", "serve_unary"]
