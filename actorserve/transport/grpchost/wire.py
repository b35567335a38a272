"""One call's messages on grpclib's HTTP/2 stream: :class:`Wire` (grpclib 0.4.9's
private API, as :mod:`.h2` reaches into it for the server and its connections).

- :class:`Wire` reads and writes gzip/deflate messages (grpclib raises on a compressed
  message and never sends one), framing them itself on grpclib's HTTP/2 stream with
  :mod:`actorserve.transport.compression`; a request stream that has already ended
  (a unary call, nearly always) is taken from grpclib's buffer in one piece;
- :meth:`Wire.send_many` writes every message already waiting in one ``send_data`` on
  the HTTP/2 stream (grpclib writes one message per ``send_data``), then keeps
  grpclib's own bookkeeping right (headers sent, message sent, counters), so its
  trailers and statistics stay correct.

:func:`frame_messages` is the pure part (bytes in, bytes out), tested without a server.
Everything else here runs on grpclib's asyncio loop.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import AckedData
from grpclib.server import Stream

from ...errors import BadInput
from ...proto.counts import PRECHECKS
from .. import compression

#: messages at least this large are parsed in a worker thread: betterproto2 parses in
#: Python, about a tenth of a second for 100 KB of small nested messages.
PARSE_IN_THREAD_BYTES: Final = 32 * 1024

#: The 5-byte gRPC message prefix: compressed flag, big-endian length.
PREFIX: Final = struct.Struct(">?I")

#: What a response's ``grpc-accept-encoding`` lists.
ACCEPT_ENCODING: Final = ",".join((*compression.ENCODINGS, "identity"))

#: Bytes of messages joined into one write at most (unless one message is bigger):
#: bounds the copy, while a batch of small messages still goes in one DATA frame.
WRITE_CHUNK: Final = 256 * 1024


def frame_messages(
    payloads: Iterable[bytes], encoding: str | None = None, min_bytes: int = 0, chunk_bytes: int = WRITE_CHUNK
) -> list[bytes]:
    """Serialized messages as gRPC frames (prefix + payload each), joined into chunks
    of about ``chunk_bytes`` (a chunk holds at least one whole message), each to be
    written at once.

    With an ``encoding``, each payload of at least ``min_bytes`` is compressed (flag 1);
    smaller ones go plain (flag 0) in the same call, as gRPC allows per message."""
    chunks: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for payload in payloads:
        compressed = encoding is not None and len(payload) >= min_bytes
        if compressed:
            assert encoding is not None
            payload = compression.compress(payload, encoding)
        if parts and size + len(payload) > chunk_bytes:
            chunks.append(b"".join(parts))
            parts, size = [], 0
        parts.append(PREFIX.pack(compressed, len(payload)))
        parts.append(payload)
        size += PREFIX.size + len(payload)
    if parts:
        chunks.append(b"".join(parts))
    return chunks


async def _read(h2: Any, size: int, short: str) -> bytes:
    """``size`` bytes of the HTTP/2 stream ``h2`` (b"" at its end); INTERNAL ``short``
    when it ends part way (grpclib's buffer asserts on that)."""
    try:
        data: bytes = await h2.recv_data(size)
    except AssertionError:
        raise GRPCError(Status.INTERNAL, short) from None
    return data


def _take_ended(buffer: Any) -> bytes | None:
    """Every byte of a request stream that has ended and is not read yet, taken from
    grpclib's ``Buffer`` at once and acknowledged in one WINDOW_UPDATE (None when the
    stream is still open or was read from): a unary call's message then costs no
    ``Queue.get`` and ack per read."""
    if not buffer._eof or buffer._acked_size:
        return None
    queue = buffer._unacked
    chunks, acked = [], 0
    while not queue.empty():
        data, _, ack_size = queue.get_nowait()
        chunks.append(data)
        acked += ack_size
    if acked:
        buffer._ack_callback(acked)
    return b"".join(chunks)


def _keep(buffer: Any, rest: bytes) -> None:
    """Put ``rest`` (bytes after the message :func:`_take_ended` took) back in grpclib's
    ``Buffer`` as read but not consumed, where its next ``read`` finds them."""
    if rest:
        buffer._acked.append(AckedData(memoryview(rest), len(rest)))
        buffer._acked_size += len(rest)


class Wire:
    """Reads and writes one call's messages (on grpclib's asyncio loop).

    Reading frames messages itself (bounded by ``max_bytes``, see :meth:`recv`); unary
    replies without compression are grpclib's own ``send_message``. With a request in
    gzip or deflate, it answers in that encoding when the client also accepts it. :meth:`send_many`
    always frames itself: one HTTP/2 write for the lot.

    Errors are :class:`GRPCError`: UNIMPLEMENTED for an unknown encoding (raised by the
    constructor), RESOURCE_EXHAUSTED for a message over ``max_bytes`` (inflated or
    not), INTERNAL for one that does not inflate.
    """

    __slots__ = ("max_bytes", "min_bytes", "recv_type", "request_encoding", "response_encoding", "stream")

    def __init__(self, stream: Stream[Any, Any], recv_type: Any, *, max_bytes: int, min_bytes: int) -> None:
        self.stream = stream
        self.recv_type = recv_type
        self.max_bytes = max_bytes
        #: smallest response message worth compressing
        self.min_bytes = min_bytes
        encoding = accept = None
        for key, value in getattr(stream._stream, "headers", None) or ():
            if key == "grpc-encoding":
                encoding = value.strip().lower()
            elif key == "grpc-accept-encoding":
                accept = value
        try:
            self.request_encoding = compression.normalise(encoding)
        except compression.BadEncoding:
            raise GRPCError(
                Status.UNIMPLEMENTED,
                f"message encoding {encoding!r} is not supported"
                f" (supported: identity, {', '.join(compression.ENCODINGS)})",
            ) from None
        # A client that compresses its request with an encoding it also accepts gets
        # responses in that encoding. grpc-accept-encoding alone is not asking: grpcio
        # sends "identity, deflate, gzip" on every call.
        accepted = {a.strip().lower() for a in accept.split(",")} if accept else set()
        self.response_encoding = self.request_encoding if self.request_encoding in accepted else None

    def request_ended(self) -> bool:
        """Whether the client has half-closed and nothing of its request stream was read
        yet: every message is in the buffer, and :meth:`recv` returns without waiting
        for the network."""
        buffer = self.stream._stream.buffer
        return bool(buffer._eof) and not buffer._acked_size

    async def recv_one(self) -> Any:
        """The request message of a unary-request call; INVALID_ARGUMENT if it has none."""
        message = await self.recv()
        if message is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "the call carried no request message")
        return message

    async def recv(self) -> Any:
        """The next message, or None when the client has half-closed.

        Framed here, not by grpclib (which buffers whatever length a prefix announces,
        up to 4 GiB, and fails on a short or invalid message with an unexplained
        INTERNAL): a prefix over ``max_bytes`` is RESOURCE_EXHAUSTED before its message
        is read; a stream ending inside a message, or a compressed flag on a call
        without ``grpc-encoding``, INTERNAL (the gRPC spec's framing errors); a message
        that does not parse, INVALID_ARGUMENT."""
        h2 = self.stream._stream
        whole = _take_ended(h2.buffer)
        if whole is None:
            prefix = await _read(h2, PREFIX.size, "the request ended inside a message prefix")
        else:
            prefix = whole[: PREFIX.size]
            if 0 < len(prefix) < PREFIX.size:
                raise GRPCError(Status.INTERNAL, "the request ended inside a message prefix")
        if not prefix:
            return None
        compressed, size = PREFIX.unpack(prefix)
        if size > self.max_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED, f"message of {size} bytes is larger than {self.max_bytes}"
            )
        if whole is None:
            data = await _read(h2, size, f"the request ended inside a message of {size} bytes")
        else:
            end = PREFIX.size + size
            data = whole[PREFIX.size : end]
            _keep(h2.buffer, whole[end:])
        if len(data) < size:  # the stream ended inside the message
            raise GRPCError(Status.INTERNAL, f"the request ended inside a message of {size} bytes")
        if compressed:
            if self.request_encoding is None:
                raise GRPCError(Status.INTERNAL, "a compressed message on a call without grpc-encoding")
            data = self._decompress(data)
        h2.connection.messages_received += 1  # what grpclib's recv_message counts
        h2.connection.last_message_received = time.monotonic()
        if len(data) < PARSE_IN_THREAD_BYTES:
            return self._parse(data)
        # betterproto2 parses in Python: megabytes take long enough to stall every other
        # call (and, in one process, the REST port) on this loop.
        return await asyncio.get_running_loop().run_in_executor(None, self._parse, data)

    def _parse(self, data: bytes) -> Any:
        # (the inference methods decode with proto/upb.py's decoder: its betterproto2 class's check)
        precheck = PRECHECKS.get(getattr(self.recv_type, "message_class", self.recv_type))
        if precheck is not None:
            try:
                precheck(data)
            except BadInput as exc:
                raise GRPCError(Status.RESOURCE_EXHAUSTED, exc.message) from None
        try:
            return self.recv_type.FromString(data)
        except Exception as exc:  # betterproto2 raises several kinds on bad wire data
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"the request is not a valid {self.recv_type.__name__} message ({exc})",
            ) from None

    def _decompress(self, data: bytes) -> bytes:
        assert self.request_encoding is not None
        try:
            return compression.decompress(data, self.request_encoding, self.max_bytes)
        except compression.TooLarge:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED, f"message decompresses to more than {self.max_bytes} bytes"
            ) from None
        except compression.BadEncoding as exc:
            raise GRPCError(
                Status.INTERNAL, f"cannot decompress a {self.request_encoding} message: {exc}"
            ) from None

    async def send(self, message: Any) -> None:
        """One message (a unary reply, or a lone stream message), as :meth:`send_many`
        writes it: grpclib's own ``send_message`` refuses a message that is not of the
        method's betterproto2 class, and the hot replies are upb's (see proto/upb.py)."""
        await self.send_many((message,))

    async def send_many(self, messages: Sequence[Any]) -> None:
        """Every message in one HTTP/2 ``send_data`` (one per :data:`WRITE_CHUNK` of
        big ones): serialized, framed (compressed where the call asked for it) and
        joined. grpclib's ``send_data`` splits the bytes into DATA frames by the peer's
        flow-control window and frame size, and waits for the window, as its own
        per-message send does."""
        chunks = frame_messages(
            (message.SerializeToString() for message in messages), self.response_encoding, self.min_bytes
        )
        await self._send_headers()
        stream = self.stream
        h2 = stream._stream
        for chunk in chunks:
            await h2.send_data(chunk)
        # grpclib's bookkeeping, as its send_message keeps it (no SendMessage events:
        # actorserve registers no listeners).
        stream._send_message_done = True
        stream._messages_sent += len(messages)
        h2.connection.messages_sent += len(messages)
        h2.connection.last_message_sent = time.monotonic()

    async def _send_headers(self) -> None:
        stream = self.stream
        if stream._send_initial_metadata_done:
            return
        if self.response_encoding is None:
            await stream.send_initial_metadata()
            return
        await stream._stream.send_headers(
            [
                (":status", "200"),
                ("content-type", stream._content_type),
                ("grpc-encoding", self.response_encoding),
                ("grpc-accept-encoding", ACCEPT_ENCODING),
            ]
        )
        # grpclib sends the trailers at the end, and must know the headers went out.
        stream._send_initial_metadata_done = True


__all__ = [
    "ACCEPT_ENCODING",
    "PARSE_IN_THREAD_BYTES",
    "PREFIX",
    "WRITE_CHUNK",
    "Wire",
    "frame_messages",
]
