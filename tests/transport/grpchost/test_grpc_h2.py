"""actorserve.transport.grpchost.h2 without a server: framing as plain bytes, and
:meth:`Wire.send_many` against a stand-in for grpclib's stream that records each
``send_data``."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from support.grpcframes import unframe

from actorserve.proto import inference as pb
from actorserve.transport.grpchost.h2 import ACCEPT_ENCODING, Wire, frame_messages


def test_frames_are_prefixed_and_joined() -> None:
    (chunk,) = frame_messages([b"ab", b"", b"xyz"])
    assert chunk == b"\x00\x00\x00\x00\x02ab" + b"\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x00\x03xyz"


def test_only_messages_of_min_bytes_are_compressed() -> None:
    big, small = b"x" * 100, b"tiny"
    (chunk,) = frame_messages([big, small], "gzip", min_bytes=50)
    (flag_big, body_big), (flag_small, body_small) = unframe(chunk)
    assert (flag_big, gzip.decompress(body_big)) == (True, big)
    assert (flag_small, body_small) == (False, small)
    ((flag, body),) = unframe(frame_messages([big], "deflate")[0])
    assert (flag, zlib.decompress(body)) == (True, big)


def test_chunks_hold_whole_messages_up_to_the_chunk_size() -> None:
    payloads = [bytes([i]) * 40 for i in range(5)]
    chunks = frame_messages(payloads, chunk_bytes=100)
    assert [len(unframe(c)) for c in chunks] == [2, 2, 1]
    assert [body for c in chunks for _, body in unframe(c)] == payloads
    (alone,) = frame_messages([b"z" * 500], chunk_bytes=100)  # one message bigger than a chunk
    assert unframe(alone) == [(False, b"z" * 500)]


class FakeConnection:
    messages_sent = 0
    last_message_sent = 0.0


class FakeH2Stream:
    """grpclib's protocol-level stream: records what would go on the wire."""

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers
        self.connection = FakeConnection()
        self.sent: list[tuple[str, Any]] = []

    async def send_headers(self, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        self.sent.append(("headers", dict(headers)))

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        self.sent.append(("data", data))


class FakeStream:
    """grpclib's server ``Stream``, as far as :class:`Wire` uses it."""

    _content_type = "application/grpc+proto"

    def __init__(self, headers: list[tuple[str, str]] = []) -> None:  # noqa: B006
        self._stream = FakeH2Stream(headers)
        self._send_initial_metadata_done = False
        self._send_message_done = False
        self._messages_sent = 0

    async def send_initial_metadata(self) -> None:
        await self._stream.send_headers([(":status", "200"), ("content-type", self._content_type)])
        self._send_initial_metadata_done = True


def wire(stream: FakeStream, min_bytes: int = 0) -> Wire:
    return Wire(stream, pb.ModelInferRequest, max_bytes=1 << 20, min_bytes=min_bytes)  # type: ignore[arg-type]


def replies(*ids: str) -> list[pb.ModelStreamInferResponse]:
    return [pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=i)) for i in ids]


async def test_send_many_is_one_send_data_after_the_headers() -> None:
    stream = FakeStream()
    messages = replies("a", "b", "c")
    await wire(stream).send_many(messages)
    await wire(stream).send_many(replies("d"))
    kinds = [kind for kind, _ in stream._stream.sent]
    assert kinds == ["headers", "data", "data"]
    assert stream._stream.sent[0][1] == {":status": "200", "content-type": "application/grpc+proto"}
    first = unframe(stream._stream.sent[1][1])
    assert [pb.ModelStreamInferResponse.FromString(b).infer_response.id for _, b in first] == ["a", "b", "c"]
    assert (stream._send_message_done, stream._messages_sent, stream._stream.connection.messages_sent) == (
        True,
        4,
        4,
    )


async def test_send_many_compresses_each_message_when_the_call_asked() -> None:
    stream = FakeStream([("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity, gzip")])
    w = wire(stream, min_bytes=0)
    assert (w.request_encoding, w.response_encoding) == ("gzip", "gzip")
    await w.send_many(replies("a", "b"))
    (_, headers), (_, data) = stream._stream.sent
    assert headers["grpc-encoding"] == "gzip"
    assert headers["grpc-accept-encoding"] == ACCEPT_ENCODING
    assert stream._send_initial_metadata_done  # so grpclib sends trailers, not headers again
    ids = [
        pb.ModelStreamInferResponse.FromString(gzip.decompress(b)).infer_response.id for _, b in unframe(data)
    ]
    assert ids == ["a", "b"]


def test_responses_are_compressed_only_when_the_request_was() -> None:
    assert wire(FakeStream([("grpc-accept-encoding", "identity,deflate,gzip")])).response_encoding is None
    assert wire(FakeStream([("grpc-encoding", "deflate")])).response_encoding is None  # not accepted back
    with pytest.raises(GRPCError) as info:
        wire(FakeStream([("grpc-encoding", "snappy")]))
    assert info.value.status is Status.UNIMPLEMENTED
