"""Batch composition for continuous batching: pure, synchronous, no I/O.

The :class:`Scheduler` knows work only by key. Work is *submitted* (waiting), *admitted*
(in the running batch) and *finished* (gone). Its rules:

- at most ``max_batch_size`` items are admitted at once;
- admission is first come, first served; an item waits while another item of the same
  sequence is admitted (two requests of one sequence never run together), without
  holding back the items behind it;
- every admitted item that is not paused is in every step (no starvation);
- finished and cancelled items leave at once, and the freed slots are refilled by the
  next :meth:`Scheduler.admit`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Scheduler(Generic[K]):
    def __init__(self, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.max_batch_size = max_batch_size
        self._waiting: deque[tuple[K, Hashable | None]] = deque()
        self._running: dict[K, Hashable | None] = {}
        self._busy: set[Hashable] = set()
        self._queued: set[K] = set()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._running)

    def __contains__(self, key: object) -> bool:
        return key in self._running or key in self._queued

    def submit(self, key: K, sequence: Hashable | None = None) -> None:
        """Queue ``key``; ``sequence`` groups keys that must never run together."""
        if key in self:
            raise ValueError(f"{key!r} is already scheduled")
        self._waiting.append((key, sequence))
        self._queued.add(key)

    def admit(self) -> list[K]:
        """Move waiting keys into the batch while there is room; return the new ones."""
        admitted: list[K] = []
        if not self._waiting or len(self._running) >= self.max_batch_size:
            return admitted
        held: list[tuple[K, Hashable | None]] = []
        while self._waiting and len(self._running) < self.max_batch_size:
            key, sequence = self._waiting.popleft()
            if sequence is not None and sequence in self._busy:
                held.append((key, sequence))
                continue
            self._queued.discard(key)
            self._running[key] = sequence
            if sequence is not None:
                self._busy.add(sequence)
            admitted.append(key)
        self._waiting.extendleft(reversed(held))
        return admitted

    def plan(self, paused: Container[K] = ()) -> list[K]:
        """The keys to step now: every admitted key that is not paused, oldest first."""
        return [key for key in self._running if key not in paused]

    def finish(self, key: K) -> None:
        """Remove ``key`` (done, failed or cancelled), admitted or still waiting."""
        if key in self._running:
            sequence = self._running.pop(key)
            if sequence is not None:
                self._busy.discard(sequence)
            return
        if key not in self._queued:
            return
        self._queued.discard(key)
        for i, (k, _) in enumerate(self._waiting):
            if k == key:
                del self._waiting[i]
                return

    cancel = finish
