"""Counting requests in flight, and waiting until there are none."""

from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)


class Inflight:
    """How many requests are in flight; :meth:`wait_idle` returns once there are none.

    A counter made with a ``parent`` counts in its parent too, so the engine's counter
    is the sum of its hosts'. Only the trio thread touches it. Entering costs an integer
    increment: the event a waiter needs is made only when someone waits.
    """

    __slots__ = ("_idle", "_parent", "count")

    def __init__(self, parent: Inflight | None = None) -> None:
        self.count = 0
        self._parent = parent
        self._idle: trio.Event | None = None

    def enter(self) -> None:
        self.count += 1
        if self._parent is not None:
            self._parent.enter()

    def leave(self) -> None:
        if self.count <= 0:  # a leave without its enter: a bug, but never a negative count
            log.error("a request left an in-flight count twice (count stays 0)", stack_info=True)
            return
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None
        if self._parent is not None:
            self._parent.leave()

    async def wait_idle(self) -> None:
        """Return once nothing is in flight (at once, after a checkpoint, if nothing is)."""
        if not self.count:
            await trio.lowlevel.checkpoint()
        while self.count:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
