"""Bad input (issue 14) on the engine link (``--api-workers``): a front that writes garbage
frames to the engine's Unix socket gets its connection closed (never a hang, never the
engine down), and a well-behaved front on the same engine keeps being served."""

from __future__ import annotations

import functools
import os
import struct
import tempfile

import msgpack
import numpy as np
import pytest
import trio

import actorserve
from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.ipc import open_engine_client
from actorserve.ipc.engine_side import open_unix_listener, serve_fronts
from actorserve.ipc.frames import DEFAULT_LIMITS
from actorserve.models import builtin_settings

TIMEOUT = 10.0


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


GARBAGE = {
    "not msgpack": framed(b"\xc1\xc1\xc1"),
    "not an array": framed(msgpack.packb({"a": 1})),
    "unknown tag": framed(msgpack.packb([[99, 1]])),
    "an infer with a garbage request": framed(msgpack.packb([[2, 1, [1, 2, 3], None, None]])),
    "a tensor shorter than its shape": framed(
        msgpack.packb(
            [[2, 1, [None, None, None, {}, [["t", "FP32", [2], b"\x00" * 4, {}]], []], "identity", None]]
        )
    ),
    "a frame over the limit": struct.pack(">I", DEFAULT_LIMITS.max_frame_bytes + 1),
    "a call id reused": framed(msgpack.packb([[1, 5, "ready", {}], [1, 5, "ready", {}]])),
}


async def closed_by_the_engine(path: str, data: bytes) -> bytes:
    """Write ``data``, then read until the engine closes the connection (bounded)."""
    stream = await trio.open_unix_socket(path)
    received = b""
    async with stream:
        await stream.send_all(data)
        with trio.fail_after(TIMEOUT):
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


async def test_garbage_frames_close_that_front_only(caplog: pytest.LogCaptureFixture) -> None:
    models = [m for m in builtin_settings() if m.name == "identity"]
    with tempfile.TemporaryDirectory(prefix="asrel-") as folder:
        path = os.path.join(folder, "engine.sock")
        async with actorserve.open_engine(models) as engine, trio.open_nursery() as nursery:
            listener = await open_unix_listener(path)
            await nursery.start(functools.partial(serve_fronts, engine, listener))
            async with open_engine_client(path) as client:
                for name, data in GARBAGE.items():
                    await closed_by_the_engine(path, data)  # fails the test on a hang
                    value = len(name)
                    request = InferenceRequest(
                        [tensor_from_numpy("INPUT0", np.array([value], dtype=np.int64))], id=name
                    )
                    with trio.fail_after(TIMEOUT):
                        response = await client.infer(request, model="identity")
                    assert response.output("OUTPUT0").data.tolist() == [value], name
                # a front that sends half a frame and goes away: closed on its EOF
                stream = await trio.open_unix_socket(path)
                await stream.send_all(framed(msgpack.packb([[1, 9, "ready", {}]]))[:7])
                await stream.aclose()
                assert await client.ready() is True
            closed = [
                r.getMessage() for r in caplog.records if r.getMessage().startswith("front connection closed")
            ]
            assert len(closed) == len(GARBAGE), closed  # each said why (not silently)
            assert "a frame is not valid msgpack" in closed[0]
            stats = await engine.statistics("identity")
            assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0)
            nursery.cancel_scope.cancel()
