"""Give freed memory back to the system once a process is idle after load.

A burst of connections (a thousand clients at once) makes every process that holds them
allocate per-connection state; once the burst is over, Python's live data is back to its
level before it, but the process keeps most of its peak RSS: cycles (tasks, coroutines,
exceptions and their frames) wait for a garbage collection that an idle process, which
allocates nothing, does not run; and what is freed stays on glibc's free lists (free()
returns only the top of the heap). See docs/reliability.md, "Overload", for the figures
(and for what this cannot give back: pymalloc's arenas, pinned by a few survivors).

:func:`trim_heap_when_idle` watches the CPU time of its process: once the process has
done at least :data:`MIN_WORK` seconds of work since the last trim and then a whole
:data:`INTERVAL` passes nearly idle, it runs a full collection and glibc's
``malloc_trim(0)`` in a worker thread. So this follows each busy period at most once,
never runs under load, and costs nothing while the process idles. Elsewhere than Linux
with glibc (no ``malloc_trim``) it returns at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
import time
from collections.abc import Callable
from functools import cache
from typing import Final

import attrs
import trio

log = logging.getLogger(__name__)

#: seconds between two looks at the process's CPU time
INTERVAL = 1.0
#: CPU seconds per :data:`INTERVAL` below which the process counts as idle
IDLE_CPU = 0.05
#: CPU seconds of work since the last trim that make a trim worth it once idle
MIN_WORK = 0.2


@cache
def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (releases the GIL while it runs), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl and other libcs have no malloc_trim
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


@attrs.define
class TrimPolicy:
    """When to trim, from the CPU time the process used (no I/O, no clock of its own)."""

    idle_cpu: float = IDLE_CPU
    min_work: float = MIN_WORK
    #: CPU seconds used since the last trim
    work: float = 0.0

    def tick(self, used: float) -> bool:
        """``used`` CPU seconds in the last interval; True: trim now."""
        if used >= self.idle_cpu:
            self.work += used
            return False
        if self.work < self.min_work:
            return False
        self.work = 0.0
        return True


def _rss() -> int:
    """Resident bytes of this process (Linux), 0 elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _page_size()
    except (OSError, IndexError, ValueError):
        return 0


@cache
def _page_size() -> int:
    import resource

    return resource.getpagesize()


def trim_now() -> int:
    """A full garbage collection, then ``malloc_trim(0)``, in this thread; the bytes of RSS
    they gave back (0 without glibc).

    The collection first: what a burst leaves is mostly cycles (tasks, coroutines,
    exceptions and their frames) that an idle process, allocating nothing, would not
    collect for a long time, and memory still held by them cannot be trimmed."""
    trim = malloc_trim()
    if trim is None:
        return 0
    before = _rss()
    gc.collect()
    trim(0)
    return max(0, before - _rss())


async def trim_heap_when_idle(
    interval: float = INTERVAL,
    policy: TrimPolicy | None = None,
    *,
    cpu: Callable[[], float] = time.process_time,
    trim: Callable[[], int] = trim_now,
) -> None:
    """Until cancelled: after each busy period, once the process is idle, trim the C heap
    (``trim`` in a worker thread; ``cpu`` is the process's CPU time). Without glibc's
    ``malloc_trim`` it returns at once."""
    if malloc_trim() is None:
        return
    policy = policy or TrimPolicy()
    last = cpu()
    while True:
        await trio.sleep(interval)
        now = cpu()
        if policy.tick(now - last):
            freed = await trio.to_thread.run_sync(trim)
            log.debug("idle after load: malloc_trim gave back %.1f MiB", freed / 2**20)
            now = cpu()  # the trim's own CPU is not work
        last = now


#: ``gc.set_threshold`` of a CLI process once it is ready (CPython's default: 700, 10, 10)
GC_THRESHOLDS: Final = (20_000, 20, 20)


def freeze_startup_objects() -> None:
    """Collect, then move every object alive now (modules, torch, the loaded models) out
    of the garbage collector's sight (``gc.freeze``). Call it once a process is ready.

    A full collection walks every tracked object: about 0.1 s with torch imported, a
    pause of the whole event loop that any request allocating enough containers (a few
    thousand chat messages or inputs) triggered. Objects made at startup live as long
    as the process, so walking them is wasted. Only the CLI's processes call it (an
    embedding program owns its own heap: ``serve(freeze_heap=True)`` opts in).

    It also raises the young generation's threshold (:data:`GC_THRESHOLDS`): serving
    allocates and frees containers per event, and at CPython's 700 a young collection ran
    every ~65 streamed events, promoting the requests in flight to older generations that
    later full collections walk again."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


__all__ = ["TrimPolicy", "freeze_startup_objects", "malloc_trim", "trim_heap_when_idle", "trim_now"]
