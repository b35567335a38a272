"""The server's processes run trio on :class:`~actorserve.server.clock.PreciseClock`: a
near deadline arms a timerfd so ``epoll_wait`` returns on it rather than at the next whole
millisecond. These tests check what it arms and when, that sleeps never end early, and
that :func:`~actorserve.server.clock.run` is ``trio.run`` otherwise (values, errors);
how late a sleep ends is measured by benchmarks, never asserted here."""

from __future__ import annotations

import ctypes
import sys
from time import perf_counter

import pytest
import trio

from actorserve.server import clock

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


class CountingTimer:
    """Stands for the timerfd: records what it was armed for."""

    fd = -1

    def __init__(self) -> None:
        self.armed: list[float] = []

    def arm(self, at: float) -> None:
        self.armed.append(at)

    def close(self) -> None:
        pass


def test_a_near_deadline_is_armed_once_a_far_one_never() -> None:
    timer = CountingTimer()
    precise = clock.PreciseClock(timer)  # type: ignore[arg-type]
    now = precise.current_time()
    near = now + clock.HORIZON / 2
    assert 0 < precise.deadline_to_sleep_time(near) <= clock.HORIZON / 2
    assert precise.deadline_to_sleep_time(near) > 0  # the same deadline again: no syscall
    assert timer.armed == [near]
    precise.deadline_to_sleep_time(now + 10 * clock.HORIZON)  # a keep-alive: epoll's millisecond
    precise.deadline_to_sleep_time(float("inf"))  # nothing scheduled
    assert precise.deadline_to_sleep_time(now - 1) < 0  # past: trio waits 0, nothing armed
    assert timer.armed == [near]
    sooner = now + clock.HORIZON / 4
    precise.deadline_to_sleep_time(sooner)
    assert timer.armed == [near, sooner]


def test_a_timer_that_fails_turns_precision_off_and_never_raises_in_the_run_loop() -> None:
    class Broken(CountingTimer):
        def arm(self, at: float) -> None:
            raise OSError(22, "timerfd_settime failed")

    precise = clock.PreciseClock(Broken())  # type: ignore[arg-type]
    deadline = precise.current_time() + clock.HORIZON / 2
    assert precise.deadline_to_sleep_time(deadline) > 0
    assert precise._timer is None


@linux_only
def test_sleeps_under_the_precise_clock_never_end_before_their_deadline() -> None:
    async def main() -> list[float]:
        assert isinstance(trio.lowlevel.current_clock(), clock.PreciseClock)
        early: list[float] = []

        async def sleeper(k: int) -> None:
            for _ in range(5):
                deadline = trio.current_time() + 0.001 + k * 0.0003
                await trio.sleep_until(deadline)
                early.append(deadline - perf_counter())

        async with trio.open_nursery() as nursery:
            for k in range(8):
                nursery.start_soon(sleeper, k)
        return early

    early = clock.run(main)
    assert len(early) == 40 and max(early) <= 0


@linux_only
def test_the_timerfd_is_armed_on_the_deadline_itself() -> None:
    timer = clock._TimerFd()
    try:
        precise = clock.PreciseClock(timer)
        deadline = precise.current_time() + 0.05
        precise.deadline_to_sleep_time(deadline)
        spec = clock._Itimerspec()
        before = perf_counter()
        assert ctypes.CDLL(None).timerfd_gettime(timer.fd, ctypes.byref(spec)) == 0
        after = perf_counter()
        remaining = spec.it_value.tv_sec + spec.it_value.tv_nsec / 1e9  # relative, as gettime says
        assert deadline - after - 1e-6 <= remaining <= deadline - before + 1e-6
    finally:
        timer.close()


def test_run_returns_the_value_and_raises_the_error_of_the_function() -> None:
    async def value(x: int) -> int:
        await trio.lowlevel.checkpoint()
        return x + 1

    async def failing() -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("boom")

    assert clock.run(value, 41) == 42
    with pytest.raises(KeyError, match="boom"):
        clock.run(failing)


def test_precise_timers_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACTORSERVE_PRECISE_TIMERS", "0")

    async def which() -> bool:
        return isinstance(trio.lowlevel.current_clock(), clock.PreciseClock)

    assert clock.run(which) is False
