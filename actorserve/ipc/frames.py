"""The engine link's messages and frames. No I/O: bytes in, messages out, and back.

A **frame** is a 4-byte big-endian length, then that many bytes: a msgpack array of
**messages**. A message is a msgpack array ``[tag, call id, fields...]``; call ids are
chosen by the front (one id per call, never reused on a connection). Tensors travel as
msgpack ``bin`` in Triton's raw layout, parameters as msgpack maps; nothing is pickled.

Front -> engine: :class:`Call` (a unary method), :class:`Infer`, :class:`OpenStream`,
:class:`OpenStreamIn` + :class:`StreamRequest` / :class:`StreamInputEnd`, :class:`Ack`
(responses consumed: stream credit back), :class:`Cancel`.
Engine -> front: :class:`Reply`, :class:`Opened`, :class:`StreamOutputs`, :class:`End`,
:class:`Failed`, :class:`Credit` (stream-in requests the engine can take).

Each message is encoded on its own (:func:`encode_message`) by the task that produced
it, so a value that cannot cross fails that call only; a writer then joins whatever
messages are waiting into one frame (:func:`encode_frame`). Streams' responses are the
exception: each stream encodes its **entry** (:func:`encode_stream_entry`: the call id and
its responses as deltas, see :mod:`.deltas`), and the entries waiting together leave as
ONE :class:`StreamOutputs` message (:func:`encode_stream_outputs`).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import msgpack

from ..errors import BadInput
from ..types import InferenceRequest
from .values import (
    WireError,
    plain_default,
    request_from_plain,
    request_to_plain,
)

_LENGTH: Final = struct.Struct(">I")
#: each thread's msgpack Packer: a reused one packs a stream entry in 0.9 us, a fresh one
#: per ``packb`` in 2.3 us (msgspec's Encoder: 0.4 us; see docs/architecture.md)
_PACKERS: Final = threading.local()
_ARRAY16: Final = struct.Struct(">BH")
_ARRAY32: Final = struct.Struct(">BI")


@attrs.frozen(slots=True)
class LinkLimits:
    """The bounds of one engine link (both ends use the same values)."""

    #: the largest frame body; a single message larger than this cannot be sent.
    max_frame_bytes: int = 256 * 1024 * 1024
    #: encoded messages waiting for a connection's writer before producers wait.
    outbox_messages: int = 1024
    outbox_bytes: int = 64 * 1024 * 1024
    #: responses of one stream the engine sends before the front acknowledges them;
    #: beyond it the engine stops pulling that stream (its batch item then sits out steps).
    window: int = 64
    #: calls open at once on one connection.
    max_calls: int = 4096


DEFAULT_LIMITS: Final = LinkLimits()


# -- messages ---------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Call:
    """A unary method of :data:`actorserve.unary.UNARY_CALLS`: its name and its record's
    fields (:func:`~actorserve.ipc.unary_values.call_to_plain`)."""

    id: int
    method: str
    args: Mapping[str, Any]


@attrs.frozen(slots=True)
class Infer:
    id: int
    request: InferenceRequest
    model: str | None
    version: str | None


@attrs.frozen(slots=True)
class OpenStream:
    """``infer_stream``; the engine may send ``window`` responses before an :class:`Ack`."""

    id: int
    request: InferenceRequest
    model: str | None
    version: str | None
    window: int


@attrs.frozen(slots=True)
class OpenStreamIn:
    """``stream`` (requests in, responses out); the engine grants request credit with
    :class:`Credit` (``window`` to start with)."""

    id: int
    model: str
    version: str | None
    window: int


@attrs.frozen(slots=True)
class StreamRequest:
    id: int
    request: InferenceRequest


@attrs.frozen(slots=True)
class StreamInputEnd:
    id: int


@attrs.frozen(slots=True)
class Ack:
    """The front consumed ``count`` more responses of a stream."""

    id: int
    count: int


@attrs.frozen(slots=True)
class Cancel:
    """The front left the call; the engine drops it (its request leaves the batch)."""

    id: int


@attrs.frozen(slots=True)
class Reply:
    """A unary call's result in its plain form (decoded by the method's codec)."""

    id: int
    value: Any


@attrs.frozen(slots=True)
class Opened:
    """The stream started in the engine (errors at start come as :class:`Failed`)."""

    id: int


@attrs.frozen(slots=True)
class StreamOutputs:
    """The responses of several streams, sent together (call id 0): per stream its call id
    and its responses as events of :mod:`.deltas`, in order."""

    id: int
    entries: tuple[tuple[int, list[Any]], ...]


@attrs.frozen(slots=True)
class End:
    id: int


@attrs.frozen(slots=True)
class Failed:
    """The call failed: ``kind`` is the error's class name (see
    :func:`~actorserve.ipc.values.error_from_plain`)."""

    id: int
    kind: str
    message: str


@attrs.frozen(slots=True)
class Credit:
    """The engine can take ``count`` more requests of a stream-in call."""

    id: int
    count: int


@attrs.frozen(slots=True)
class ModelsChanged:
    """Pushed by the engine (call id 0) whenever a ``model_info`` / ``metadata`` answer may
    have changed (a load, unload, default version or workers change): what the front
    remembers of them is stale."""

    id: int


Message = (
    Call
    | Infer
    | OpenStream
    | OpenStreamIn
    | StreamRequest
    | StreamInputEnd
    | Ack
    | Cancel
    | Reply
    | Opened
    | StreamOutputs
    | End
    | Failed
    | Credit
    | ModelsChanged
)

_Encoder = Callable[[Any], list[Any]]
_Decoder = Callable[[int, list[Any]], Message]


def _opt_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise WireError(f"expected a string or nil, got {value!r}")


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise WireError(f"expected a string, got {value!r}")


def _count(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise WireError(f"expected a count, got {value!r}")


def _args(value: Any) -> Mapping[str, Any]:
    if isinstance(value, dict):
        return value
    raise WireError(f"expected a map, got {value!r}")


def _entries(value: Any) -> tuple[tuple[int, list[Any]], ...]:
    """Checks only the outline (call ids, lists of events): each call's decoder checks its
    events."""
    if not isinstance(value, list):
        raise WireError(f"expected a list of stream entries, got {value!r:.100}")
    entries = []
    for entry in value:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or type(entry[0]) is not int
            or not isinstance(entry[1], list)
        ):
            raise WireError(f"malformed stream entry {entry!r:.100}")
        entries.append((entry[0], entry[1]))
    return tuple(entries)


#: tag -> (class, fields after the id to plain, plain fields to message)
_CODECS: Final[dict[int, tuple[type[Any], _Encoder, _Decoder]]] = {
    1: (Call, lambda m: [m.method, m.args], lambda i, f: Call(i, _str(f[0]), _args(f[1]))),
    2: (
        Infer,
        lambda m: [request_to_plain(m.request), m.model, m.version],
        lambda i, f: Infer(i, request_from_plain(f[0]), _opt_str(f[1]), _opt_str(f[2])),
    ),
    3: (
        OpenStream,
        lambda m: [request_to_plain(m.request), m.model, m.version, m.window],
        lambda i, f: OpenStream(i, request_from_plain(f[0]), _opt_str(f[1]), _opt_str(f[2]), _count(f[3])),
    ),
    4: (
        OpenStreamIn,
        lambda m: [m.model, m.version, m.window],
        lambda i, f: OpenStreamIn(i, _str(f[0]), _opt_str(f[1]), _count(f[2])),
    ),
    5: (
        StreamRequest,
        lambda m: [request_to_plain(m.request)],
        lambda i, f: StreamRequest(i, request_from_plain(f[0])),
    ),
    6: (StreamInputEnd, lambda m: [], lambda i, f: StreamInputEnd(i)),
    7: (Ack, lambda m: [m.count], lambda i, f: Ack(i, _count(f[0]))),
    8: (Cancel, lambda m: [], lambda i, f: Cancel(i)),
    20: (Reply, lambda m: [m.value], lambda i, f: Reply(i, f[0])),
    21: (Opened, lambda m: [], lambda i, f: Opened(i)),
    27: (
        StreamOutputs,
        lambda m: [[[call_id, events] for call_id, events in m.entries]],
        lambda i, f: StreamOutputs(i, _entries(f[0])),
    ),
    23: (End, lambda m: [], lambda i, f: End(i)),
    24: (Failed, lambda m: [m.kind, m.message], lambda i, f: Failed(i, _str(f[0]), _str(f[1]))),
    25: (Credit, lambda m: [m.count], lambda i, f: Credit(i, _count(f[0]))),
    26: (ModelsChanged, lambda m: [], lambda i, f: ModelsChanged(i)),
}
_TAGS: Final[dict[type[Any], tuple[int, _Encoder]]] = {
    cls: (tag, enc) for tag, (cls, enc, _) in _CODECS.items()
}
_ARITY: Final[dict[int, int]] = {
    1: 2,
    2: 3,
    3: 4,
    4: 3,
    5: 1,
    6: 0,
    7: 1,
    8: 0,
    20: 1,
    21: 0,
    27: 1,
    23: 0,
    24: 2,
    25: 1,
    26: 0,
}


class FrameTooLarge(BadInput):
    """A message is larger than the link's ``max_frame_bytes``."""


def encode_message(message: Message, max_bytes: int | None = None) -> bytes:
    """One message as msgpack bytes, ready for :func:`encode_frame`.

    :class:`~actorserve.errors.BadInput` if a tensor does not fit its shape,
    :class:`FrameTooLarge` past ``max_bytes``, :class:`TypeError` for a parameter value
    msgpack cannot carry."""
    tag, encode = _TAGS[type(message)]
    try:
        data = _pack([tag, message.id, *encode(message)])
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadInput(f"a value cannot be sent to the other process: {exc}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise FrameTooLarge(
            f"a message of {len(data)} bytes exceeds the engine link's limit of {max_bytes} bytes"
        )
    return data


def _pack(plain: Any) -> bytes:
    """``plain`` as msgpack (a Packer resets itself when packing raises)."""
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True, default=plain_default)
    data: bytes = packer.pack(plain)
    if len(data) > JOIN_FRAME_BYTES:  # a Packer keeps the buffer it grew: let it go
        _PACKERS.packer = None
    return data


def encode_stream_entry(call_id: int, events: list[Any], max_bytes: int | None = None) -> bytes:
    """One stream's part of a :class:`StreamOutputs` message (errors as
    :func:`encode_message`)."""
    try:
        data = _pack([call_id, events])
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadInput(f"a value cannot be sent to the other process: {exc}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise FrameTooLarge(
            f"a message of {len(data)} bytes exceeds the engine link's limit of {max_bytes} bytes"
        )
    return data


#: ``[27, 0, `` of a StreamOutputs message: a 3-array, its tag, call id 0
_STREAM_OUTPUTS: Final = bytes((0x93, 27, 0))


def encode_stream_outputs(entries: Sequence[bytes]) -> bytes:
    """One :class:`StreamOutputs` message of entries from :func:`encode_stream_entry`."""
    return b"".join((_STREAM_OUTPUTS, _array_header(len(entries)), *entries))


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return _ARRAY16.pack(0xDC, count)
    return _ARRAY32.pack(0xDD, count)


def encode_frame(messages: Sequence[bytes]) -> bytes:
    """A frame holding already-encoded messages (in order)."""
    header = _array_header(len(messages))
    body_length = len(header) + sum(map(len, messages))
    return b"".join((_LENGTH.pack(body_length), header, *messages))


#: frames larger than this are written a message at a time, not joined first
JOIN_FRAME_BYTES: Final = 1 << 20


def frame_parts(messages: Sequence[bytes]) -> list[bytes]:
    """:func:`encode_frame` as the pieces to write one after the other: one for a small
    frame (one write), the head and then each message for a large one (joining them
    would hold a second copy of every tensor it carries)."""
    size = sum(map(len, messages))
    if size <= JOIN_FRAME_BYTES:
        return [encode_frame(messages)]
    header = _array_header(len(messages))
    return [_LENGTH.pack(len(header) + size) + header, *messages]


def decode_message(plain: Any) -> Message:
    """A message from its msgpack form; :class:`WireError` if it is malformed."""
    if not isinstance(plain, list) or len(plain) < 2:
        raise WireError(f"a message must be [tag, id, ...], got {plain!r:.100}")
    tag, call_id, *fields = plain
    codec = _CODECS.get(tag) if isinstance(tag, int) else None
    if codec is None or _ARITY[tag] != len(fields):
        raise WireError(f"unknown message {tag!r} with {len(fields)} fields")
    if isinstance(call_id, bool) or not isinstance(call_id, int):
        raise WireError(f"a call id must be an integer, got {call_id!r}")
    return codec[2](call_id, fields)


class FrameDecoder:
    """Splits a byte stream into frames and decodes their messages.

    Feed it what the socket gave (:meth:`feed`), then take frames with
    :meth:`next_frame` until it returns None. A frame whose length header is past
    ``max_frame_bytes``, or that is not a msgpack array of valid messages, raises
    :class:`WireError` (the connection cannot be trusted after it)."""

    __slots__ = ("_buffer", "_max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buffer)

    def next_frame(self) -> list[Message] | None:
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (length,) = _LENGTH.unpack_from(buffer)
        if length > self._max_frame_bytes:
            raise WireError(f"a frame of {length} bytes exceeds the limit of {self._max_frame_bytes} bytes")
        if len(buffer) < 4 + length:
            return None
        try:
            # unpacked where it lies (msgpack copies what it keeps): a copy of a large
            # frame first would be one more of it in memory
            with memoryview(buffer) as view, view[4 : 4 + length] as body:
                plain = msgpack.unpackb(body, raw=False)
        except (ValueError, TypeError) as exc:  # msgpack's own errors are ValueErrors
            raise WireError(f"a frame is not valid msgpack: {exc}") from None
        del buffer[: 4 + length]
        if not isinstance(plain, list):
            raise WireError("a frame must be a msgpack array of messages")
        return [decode_message(m) for m in plain]
