"""SSE framing and the streaming body: pure functions, and the Quart response the REST
transport builds (no network)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

import pytest
import trio

from actorserve import open_engine
from actorserve.errors import ModelFailed, Overloaded
from actorserve.models import builtin_settings as builtin_models
from actorserve.settings import Settings
from actorserve.transport import sse
from actorserve.transport.rest import create_app


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


class Source:
    """An async generator of ints that records whether it was closed."""

    def __init__(self, items: list[int | Exception]) -> None:
        self.items = items
        self.closed = False

    async def run(self) -> AsyncGenerator[int, None]:
        try:
            for item in self.items:
                await trio.lowlevel.checkpoint()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed = True


def encode(item: int) -> bytes:
    return str(item).encode()


async def frames_of(first: int | None, source: Source, *, end_event: bool = False) -> list[bytes]:
    return [f async for f in sse.event_frames(first, source.run(), encode, end_event=end_event)]


async def test_event_frames_in_order_then_closed() -> None:
    source = Source([2, 3])
    assert await frames_of(1, source) == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    assert source.closed


async def test_empty_stream() -> None:
    assert await frames_of(None, Source([])) == []
    assert await frames_of(None, Source([]), end_event=True) == [sse.END_FRAME]


async def test_error_after_start_is_the_last_event() -> None:
    source = Source([2, ModelFailed("model 'm' failed"), 4])
    frames = await frames_of(1, source, end_event=True)
    assert frames == [
        b"data: 1\n\n",
        b"data: 2\n\n",
        b'event: error\ndata: {"error":"model \'m\' failed","status":500}\n\n',
        sse.END_FRAME,
    ]
    assert source.closed


async def test_closing_the_frames_closes_the_source() -> None:
    source = Source([2, 3, 4])
    frames = sse.event_frames(1, source.run(), encode)
    assert await frames.__anext__() == b"data: 1\n\n"
    assert await frames.__anext__() == b"data: 2\n\n"
    await frames.aclose()  # what the web framework does when the client goes away
    assert source.closed


async def test_cancelling_the_reader_closes_the_source() -> None:
    source = Source([2, 3])
    gate = trio.Event()

    async def slow() -> AsyncGenerator[int, None]:
        try:
            yield 2
            await gate.wait()
            yield 3
        finally:
            source.closed = True

    frames = sse.event_frames(1, slow(), encode)
    with trio.move_on_after(0) as scope:
        async for _ in frames:
            scope.deadline = -float("inf")  # cancel while the source waits
    assert scope.cancelled_caught
    assert source.closed


async def test_stream_response_has_no_timeout_and_closing_it_cancels_the_request() -> None:
    streamer = [m for m in builtin_models() if m.name == "streamer"]
    settings = Settings(models=tuple(streamer), http_port=0, grpc_port=None)
    async with open_engine(settings) as engine:
        app = create_app(engine, settings)
        api = app.api
        body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["q"]}],
                "parameters": {"n_tokens": 10_000, "delay": 0.001}}  # fmt: skip
        async with app.quart.test_request_context(
            "/v2/models/streamer/infer_stream", method="POST", data=json.dumps(body).encode()
        ):
            response = await api.infer_stream("streamer")
        assert response.timeout is None  # Quart's 60 s default would cut long streams
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["X-Accel-Buffering"] == "no"
        assert (await engine.statistics("streamer")).inflight == 1  # the first response was pulled before the response started
        async with response.response as chunks:
            seen = []
            async for chunk in chunks:
                seen.append(json.loads(chunk.removeprefix(b"data: "))["outputs"][0]["data"])
                if len(seen) == 2:
                    break
        assert seen == [["q:0"], ["q:1"]]
        assert (await engine.statistics("streamer")).inflight == 0  # leaving the body closed the engine's stream
