"""The bounded mailbox."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actorserve import Overloaded
from actorserve.actors.mailbox import Mailbox


async def test_fifo_bounded_never_drops() -> None:
    box: Mailbox[int] = Mailbox(2, name="box")
    box.send_nowait(1)
    box.send_nowait(2)
    with pytest.raises(Overloaded, match="box is full"):
        box.send_nowait(3)
    assert [await box.receive(), await box.receive()] == [1, 2]
    assert box.statistics().queued == 0


async def test_receiver_wakes_on_send_and_on_close() -> None:
    box: Mailbox[str] = Mailbox(1)
    got: list[str] = []

    async def receiver() -> None:
        got.append(await box.receive())
        with pytest.raises(trio.EndOfChannel):
            await box.receive()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        box.send_nowait("x")
        await trio.testing.wait_all_tasks_blocked()
        box.send_nowait("y")
        assert box.drain() == ["y"]
    assert got == ["x"]
    with pytest.raises(trio.ClosedResourceError):
        box.send_nowait("z")


async def test_receive_is_cancellable() -> None:
    box: Mailbox[int] = Mailbox(1)
    with trio.move_on_after(0.01) as scope:
        await box.receive()
    assert scope.cancelled_caught
    box.send_nowait(5)  # the cancelled receiver left no stale registration
    assert await box.receive() == 5
