"""The in-flight counter behind ModelHost.drain and Engine.wait_idle."""

from __future__ import annotations

import trio
import trio.testing

from actorserve.actors.inflight import Inflight


async def test_wait_idle_wakes_when_the_last_leaves_and_parents_sum_children() -> None:
    engine = Inflight()
    a, b = Inflight(engine), Inflight(engine)
    with trio.testing.assert_checkpoints():
        await engine.wait_idle()  # nothing in flight
    a.enter()
    b.enter()
    b.enter()
    assert (engine.count, a.count, b.count) == (3, 1, 2)
    woken: list[str] = []

    async def wait(name: str, counter: Inflight) -> None:
        await counter.wait_idle()
        woken.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "engine", engine)
        nursery.start_soon(wait, "b", b)
        await trio.testing.wait_all_tasks_blocked()
        a.leave()
        b.leave()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        b.leave()
    assert sorted(woken) == ["b", "engine"]
    assert (engine.count, a.count, b.count) == (0, 0, 0)
    b.enter()  # a new round needs a new wait: the last one's event is gone
    with trio.move_on_after(0.01) as waited:
        await engine.wait_idle()
    assert waited.cancelled_caught
