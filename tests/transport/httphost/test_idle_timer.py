"""The idle timeout of a connection (transport/httphost/protocols.py IdleTimer): what
hypercorn's TrioSingleTask does (restart: the action anew, stop: none running), with one
task for the connection's life; close ends that task."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from actorserve.transport.httphost.protocols import IdleTimer


@attrs.define
class Group:
    """hypercorn's TaskGroup, as much as the timer uses of it."""

    _nursery: trio.Nursery


async def test_restart_runs_the_action_anew_and_stop_ends_it(autojump_clock: trio.testing.MockClock) -> None:
    started: list[float] = []
    finished: list[float] = []

    async def action() -> None:  # an idle timeout of 10 s
        started.append(trio.current_time())
        await trio.sleep(10)
        finished.append(trio.current_time())

    timer = IdleTimer()
    async with trio.open_nursery() as nursery:
        tasks_before = len(nursery.child_tasks)
        await timer.restart(Group(nursery), action)  # the connection is accepted
        await trio.sleep(4)
        await timer.stop()  # a request starts: the timeout is off
        await trio.sleep(30)
        assert finished == []
        for _ in range(5):  # five requests answered back to back
            await timer.restart(Group(nursery), action)
            await trio.sleep(1)
            await timer.stop()
        assert len(nursery.child_tasks) == tasks_before + 1  # one task, all along
        await timer.restart(Group(nursery), action)  # the last response: idle from now
        await trio.sleep(15)
        assert finished == [started[-1] + 10]  # the whole timeout, counted from the last restart
    assert len(started) == 7


async def test_close_ends_the_timer_task(autojump_clock: trio.testing.MockClock) -> None:
    async def action() -> None:
        await trio.sleep_forever()

    timer = IdleTimer()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await timer.restart(Group(nursery), action)
            await timer.stop()  # a request is running when the client hangs up
            await trio.sleep(1)
            timer.close()
        # the nursery closed: the timer's task ended on its own
    await timer.restart(Group(nursery), action)  # after the close: nothing more starts
