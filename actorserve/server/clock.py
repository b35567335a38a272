"""Timers that end on time: the server's processes run trio with :class:`PreciseClock`.

trio sleeps in ``epoll_wait``, whose timeout is whole milliseconds, rounded up: a
``trio.sleep(0.005)`` that starts 0.3 ms into a millisecond ends at the next one after its
deadline, 0.5 ms late on average. For a paced stream (a token every 5 ms, what an LLM
looks like to the server) that is a tenth of every period: 182 tokens/s a stream instead
of 200, and as much added to time to first token. asyncio rounds the same way.

On Linux the clock also arms a ``timerfd`` (nanosecond resolution) for the next deadline
each time the loop is about to wait, and a system task keeps that fd in trio's epoll set:
``epoll_wait`` returns when the fd fires, on the deadline, and trio wakes what is due in
the same round. Arming is one syscall, made only when the next deadline changed and is
near (:data:`HORIZON`): a far timer (a keep-alive, a load's timeout) keeps trio's
millisecond. Where ``timerfd`` is missing, :func:`run` is plain ``trio.run``.

The clock reads ``time.perf_counter()`` (``CLOCK_MONOTONIC``, the timerfd's clock) with
no offset. Tests run under trio's ``MockClock`` and never see this one.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Final, TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")

#: a deadline further than this (seconds) keeps epoll's millisecond: no syscall for it
HORIZON: Final = 0.1

_CLOCK_MONOTONIC: Final = 1
_TFD_NONBLOCK: Final = 0o4000
_TFD_CLOEXEC: Final = 0o2000000
_TFD_TIMER_ABSTIME: Final = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _TimerFd:
    """A non-blocking ``CLOCK_MONOTONIC`` timerfd, through libc (``os.timerfd_*`` is
    Python 3.13's)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._create = libc.timerfd_create
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        self.fd = self._create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._spec = _Itimerspec()

    def arm(self, at: float) -> None:
        """Fire once at ``at`` (seconds of ``CLOCK_MONOTONIC``)."""
        nanoseconds = max(1, int(at * 1e9))  # 0 would disarm it
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(nanoseconds, 1_000_000_000)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def close(self) -> None:
        os.close(self.fd)


class PreciseClock(trio.abc.Clock):
    """trio's clock whose waits end on the deadline (see the module docstring)."""

    def __init__(self, timer: _TimerFd | None) -> None:
        self._timer = timer
        self._armed = math.inf

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return perf_counter()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        wait = deadline - perf_counter()
        if self._timer is not None and deadline != self._armed and 0 < wait < HORIZON:
            try:
                self._timer.arm(deadline)
                self._armed = deadline
            except OSError as exc:  # never raise inside trio's run loop: fall back
                log.warning("precise timers off: %s", exc)
                self._timer = None
        return wait

    async def keep_fd_watched(self) -> None:
        """The system task that keeps the timerfd in trio's epoll set and reads each
        expiry (what wakes the loop is the fd; trio then wakes what is due)."""
        timer = self._timer
        if timer is None:
            return
        while True:
            await trio.lowlevel.wait_readable(timer.fd)
            try:
                os.read(timer.fd, 8)
            except BlockingIOError:  # re-armed after it fired: nothing to read
                pass


def _timer_fd() -> _TimerFd | None:
    if not sys.platform.startswith("linux") or os.environ.get("ACTORSERVE_PRECISE_TIMERS", "1") == "0":
        return None
    try:
        return _TimerFd()
    except (OSError, AttributeError) as exc:
        log.info("precise timers unavailable (%s): trio's millisecond waits", exc)
        return None


def run(afn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(afn, *args)`` with :class:`PreciseClock` where the platform has a
    timerfd (plain ``trio.run`` elsewhere, or with ``ACTORSERVE_PRECISE_TIMERS=0``)."""
    timer = _timer_fd()
    if timer is None:
        return trio.run(afn, *args)
    clock = PreciseClock(timer)

    async def main() -> T:
        trio.lowlevel.spawn_system_task(clock.keep_fd_watched, name="actorserve precise timers")
        return await afn(*args)

    try:
        return trio.run(main, clock=clock)
    finally:
        timer.close()
