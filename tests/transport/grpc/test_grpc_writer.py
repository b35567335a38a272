"""The ModelStreamInfer writer (:class:`StreamCall`) without a server: batches waiting
in the outbox go out in one ``send_many``, a lone one at once, and a fatal error ends
the call after the messages before it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
import trio.testing
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from actorserve.transport.grpc.streams import WRITE_BATCH, Outbox, StreamCall, _Fatal


class RecordingWire:
    """Stands in for :class:`Wire`: records each ``send_many`` (on the asyncio side)."""

    def __init__(self) -> None:
        self.writes: list[list[Any]] = []

    async def send_many(self, messages: list[Any]) -> None:
        self.writes.append(list(messages))


class Scripted(StreamCall):
    """A call whose 'requests' are a script run against the outbox."""

    def __init__(self, script: Callable[[Outbox, RecordingWire], Any], max_inflight: int = 8) -> None:
        self.recording = RecordingWire()
        super().__init__(None, self.recording, max_inflight=max_inflight, draining=trio.Event())  # type: ignore[arg-type]
        self.script = script

    async def feed(self, outbox: Outbox) -> None:
        await self.script(outbox, self.recording)


async def run(call: Scripted) -> GRPCError | None:
    """Run the call on a trio-asyncio loop; the status it ended with, if not OK."""
    async with trio_asyncio.open_loop():
        try:
            await call.run()
        except GRPCError as error:
            return error
    return None


async def test_batches_already_waiting_go_out_in_one_write() -> None:
    async def script(outbox: Outbox, wire: RecordingWire) -> None:
        outbox.send_nowait(["a1", "a2"])  # one request's next_batch()
        outbox.send_nowait(["b1"])  # another request's
        outbox.send_nowait(["c1"])
        await trio.testing.wait_all_tasks_blocked()
        assert wire.writes == [["a1", "a2", "b1", "c1"]]

    call = Scripted(script)
    assert await run(call) is None
    assert call.recording.writes == [["a1", "a2", "b1", "c1"]]


async def test_a_lone_batch_is_written_without_waiting_for_more() -> None:
    async def script(outbox: Outbox, wire: RecordingWire) -> None:
        await outbox.send(["only"])
        await trio.testing.wait_all_tasks_blocked()  # the call is still open, nothing else comes
        assert wire.writes == [["only"]]
        await outbox.send(["later"])
        await trio.testing.wait_all_tasks_blocked()
        assert wire.writes == [["only"], ["later"]]

    await run(Scripted(script))


async def test_one_write_takes_at_most_write_batch_messages_from_the_outbox() -> None:
    async def script(outbox: Outbox, wire: RecordingWire) -> None:
        for i in range(WRITE_BATCH + 1):
            outbox.send_nowait([i])

    call = Scripted(script, max_inflight=WRITE_BATCH + 1)
    await run(call)
    assert [len(w) for w in call.recording.writes] == [WRITE_BATCH, 1]


async def test_a_fatal_error_ends_the_call_after_the_messages_before_it() -> None:
    async def script(outbox: Outbox, wire: RecordingWire) -> None:
        outbox.send_nowait(["a"])
        outbox.send_nowait(_Fatal(GRPCError(Status.NOT_FOUND, "gone")))
        outbox.send_nowait(["never"])
        await trio.sleep_forever()  # the writer cancels the call

    call = Scripted(script)
    error = await run(call)
    assert error is not None
    assert (error.status, error.message) == (Status.NOT_FOUND, "gone")
    assert call.recording.writes == [["a"]]
