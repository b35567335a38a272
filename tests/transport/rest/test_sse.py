"""SSE framing (pure functions) and :func:`sse.write_events`, the coalescing event
writer, over fake response batches (no network, no engine)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

from actorserve.errors import ModelFailed, Overloaded
from actorserve.transport.rest import sse


def test_frame_single_line() -> None:
    assert sse.frame(b'{"a":1}') == b'data: {"a":1}\n\n'


def test_frame_with_event_name() -> None:
    assert sse.frame(b"{}", event="end") == b"event: end\ndata: {}\n\n"
    assert sse.END_FRAME == b"event: end\ndata: {}\n\n"


@pytest.mark.parametrize("data", [b"one\ntwo\nthree", b"one\r\ntwo\r\nthree", b"one\rtwo\rthree"])
def test_frame_splits_every_kind_of_line_break(data: bytes) -> None:
    assert sse.frame(data) == b"data: one\ndata: two\ndata: three\n\n"


def test_error_frame_uses_the_error_table() -> None:
    assert sse.error_frame(Overloaded("full")) == b'event: error\ndata: {"error":"full","status":429}\n\n'
    assert sse.error_frame(ModelFailed("boom")) == b'event: error\ndata: {"error":"boom","status":500}\n\n'
    # a bug is not described to the client
    assert sse.error_frame(KeyError("secret")) == (
        b'event: error\ndata: {"error":"internal error: KeyError","status":500}\n\n'
    )


def encode(item: int) -> bytes:
    return str(item).encode()


def test_data_frames_join_a_batch() -> None:
    assert sse.data_frames([1, 2, 3], encode) == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    assert sse.data_frames([], encode) == b""
    assert sse.data_frames(["a\nb"], str.encode) == b"data: a\ndata: b\n\n"  # framed like frame()


class Batches:
    """Batches of ints (or an exception to raise); records how often it was asked."""

    def __init__(self, batches: list[list[int] | Exception]) -> None:
        self.batches = batches
        self.asked = 0

    async def next_batch(self) -> Sequence[int]:
        await trio.lowlevel.checkpoint()
        self.asked += 1
        if not self.batches:
            raise StopAsyncIteration
        batch = self.batches.pop(0)
        if isinstance(batch, Exception):
            raise batch
        return batch


async def written(first: list[int], rest: Batches, *, end_event: bool = False) -> list[bytes]:
    """Every chunk write_events sends, then the tail it returns."""
    chunks: list[bytes] = []

    async def send(chunk: bytes) -> None:
        chunks.append(chunk)

    tail = await sse.write_events(first, rest, encode, send, end_event=end_event)
    return [*chunks, tail]


async def test_one_chunk_per_batch_in_order() -> None:
    rest = Batches([[3], [4, 5, 6]])
    assert await written([1, 2], rest) == [
        b"data: 1\n\ndata: 2\n\n",
        b"data: 3\n\n",
        b"data: 4\n\ndata: 5\n\ndata: 6\n\n",
        b"",
    ]
    assert rest.asked == 3  # the last ask ended the stream


async def test_empty_stream() -> None:
    assert await written([], Batches([])) == [b""]
    assert await written([], Batches([]), end_event=True) == [sse.END_FRAME]


async def test_error_after_start_is_the_last_event() -> None:
    rest = Batches([[2], ModelFailed("model 'm' failed"), [4]])
    assert await written([1], rest, end_event=True) == [
        b"data: 1\n\n",
        b"data: 2\n\n",
        b'event: error\ndata: {"error":"model \'m\' failed","status":500}\n\n' + sse.END_FRAME,
    ]
    assert rest.batches == [[4]]  # nothing is read after the error


async def test_an_encoding_bug_is_an_error_event() -> None:
    def broken(item: int) -> bytes:
        raise KeyError(item)

    chunks: list[bytes] = []

    async def send(chunk: bytes) -> None:
        chunks.append(chunk)

    tail = await sse.write_events([1], Batches([]), broken, send)
    assert (chunks, tail) == (
        [],
        b'event: error\ndata: {"error":"internal error: KeyError","status":500}\n\n',
    )


async def test_cancellation_propagates() -> None:
    gate = trio.Event()

    class Waiting:
        async def next_batch(self) -> Sequence[int]:
            await gate.wait()
            return [9]

    async def send(chunk: bytes) -> None:
        pass

    with trio.move_on_after(0) as scope:
        await sse.write_events([1], Waiting(), encode, send)
    assert scope.cancelled_caught
