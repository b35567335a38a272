"""Batch composition for continuous batching: pure, synchronous, no I/O.

The :class:`Scheduler` knows work only by key. Work is *submitted* (waiting), *admitted*
(in the running batch) and *finished* (gone). Its rules:

- at most ``max_batch_size`` items are admitted at once;
- admission is by priority, then first come, first served: a waiting item of a higher
  priority is admitted before every waiting item of a lower one (Triton's ``priority``:
  1 is the highest, a larger number a lower priority; none or 0 is the default, below
  every priority a client names), and items of one priority in the order they came;
- an item waits while another item of the same sequence is admitted (two requests of one
  sequence never run together), and behind an earlier waiting item of its sequence
  (whatever their priorities: a sequence's requests run in order), without holding back
  the items behind it;
- priority is strict and never ages: while higher-priority work keeps every slot busy,
  a lower-priority item waits (its request's ``timeout`` or the client bounds the wait);
  an admitted item is never preempted;
- every admitted item that is not paused is in every step (no starvation in the batch);
- finished and cancelled items leave at once, and the freed slots are refilled by the
  next :meth:`Scheduler.admit`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: the rank of a request with no priority (None or 0): below every priority a client names
#: (Triton's priority is a uint64, so every named one is smaller)
DEFAULT_RANK: Final = 2**64


def rank_of(priority: int | None) -> int:
    """The admission rank of Triton's ``priority``: smaller is admitted first."""
    return priority if priority else DEFAULT_RANK


class Scheduler(Generic[K]):
    def __init__(self, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.max_batch_size = max_batch_size
        #: rank -> the keys waiting at that rank, oldest first (an empty rank is dropped,
        #: as clients choose ranks, but the default's, which most requests use, stays)
        self._levels: dict[int, deque[tuple[K, Hashable | None]]] = {DEFAULT_RANK: deque()}
        self._running: dict[K, Hashable | None] = {}
        self._busy: set[Hashable] = set()
        self._queued: dict[K, int] = {}  # waiting key -> its rank
        #: sequence -> its waiting keys in submission order (only its first may be admitted)
        self._sequence_waiting: dict[Hashable, deque[K]] = {}

    @property
    def waiting(self) -> int:
        return len(self._queued)

    @property
    def running(self) -> int:
        return len(self._running)

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

    def __contains__(self, key: object) -> bool:
        return key in self._running or key in self._queued

    def submit(self, key: K, sequence: Hashable | None = None, priority: int | None = None) -> None:
        """Queue ``key``; ``sequence`` groups keys that must never run together (and run
        in submission order); ``priority``: Triton's (1 highest; None or 0 the default)."""
        if key in self:
            raise ValueError(f"{key!r} is already scheduled")
        rank = priority or DEFAULT_RANK  # rank_of, inline: every request passes here
        level = self._levels.get(rank)
        if level is None:
            level = self._levels[rank] = deque()
        level.append((key, sequence))
        self._queued[key] = rank
        if sequence is not None:
            self._sequence_waiting.setdefault(sequence, deque()).append(key)

    def _blocked(self, key: K, sequence: Hashable) -> bool:
        return sequence in self._busy or self._sequence_waiting[sequence][0] != key

    def admit(self) -> list[K]:
        """Move waiting keys into the batch while there is room, highest priority first;
        return the new ones."""
        admitted: list[K] = []
        if not self._queued or len(self._running) >= self.max_batch_size:
            return admitted
        levels = self._levels
        for rank in sorted(levels) if len(levels) > 1 else list(levels):
            level = levels[rank]
            held: list[tuple[K, Hashable | None]] = []
            while level and len(self._running) < self.max_batch_size:
                key, sequence = level.popleft()
                if sequence is not None and self._blocked(key, sequence):
                    held.append((key, sequence))
                    continue
                del self._queued[key]
                self._running[key] = sequence
                if sequence is not None:
                    self._busy.add(sequence)
                    waiting = self._sequence_waiting[sequence]
                    waiting.popleft()
                    if not waiting:
                        del self._sequence_waiting[sequence]
                admitted.append(key)
            if held:
                level.extendleft(reversed(held))
            if not level and rank != DEFAULT_RANK:
                del levels[rank]
            if len(self._running) >= self.max_batch_size:
                break
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
        rank = self._queued.pop(key, None)
        if rank is None:
            return
        level = self._levels[rank]
        for i, (k, sequence) in enumerate(level):
            if k == key:
                del level[i]
                if sequence is not None:
                    waiting = self._sequence_waiting[sequence]
                    waiting.remove(key)
                    if not waiting:
                        del self._sequence_waiting[sequence]
                break
        if not level and rank != DEFAULT_RANK:
            del self._levels[rank]

    cancel = finish


__all__ = ["DEFAULT_RANK", "Scheduler", "rank_of"]
