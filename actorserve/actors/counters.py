"""Counters a replica and a model version keep for Triton's statistics
(``GET /v2/models/{name}/stats``, gRPC ModelStatistics): counts and total durations.

Owned by one task each (a batcher's trio task, a host's callers on the trio thread);
nothing here locks. Durations are integer nanoseconds, as Triton reports them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs
import trio

from ..metrics import ModelMetrics
from .workitem import WorkItem


def elapsed_ns(since: float) -> int:
    """Nanoseconds from ``since`` (a ``trio.current_time()``) to now, on trio's clock."""
    return max(0, int((trio.current_time() - since) * 1e9))


@attrs.frozen
class BatcherStatistics:
    """A replica's batcher at a glance: items waiting and running, steps so far."""

    waiting: int
    running: int
    steps: int
    items_stepped: int


@attrs.define
class StepCounters:
    """One replica's steps: how many, how many items they carried, the time each batch
    size took, and how long items waited for a batch slot (submit to admission)."""

    #: where the same steps and waits also go as Prometheus histograms (or nowhere)
    metrics: ModelMetrics | None = None
    steps: int = 0
    items_stepped: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    #: batch size -> [steps of that size, their total nanoseconds]
    by_batch_size: dict[int, list[int]] = attrs.field(factory=dict)

    def stepped(self, size: int, ns: int) -> None:
        self.steps += 1
        self.items_stepped += size
        entry = self.by_batch_size.setdefault(size, [0, 0])
        entry[0] += 1
        entry[1] += ns
        if self.metrics is not None:
            self.metrics.step(size, ns / 1e9)

    def admitted(self, items: Iterable[WorkItem]) -> None:
        now = trio.current_time()
        for item in items:
            waited = max(0.0, now - item.submitted_at)
            self.queue_count += 1
            self.queue_ns += int(waited * 1e9)
            if self.metrics is not None:
                self.metrics.queue_time.observe(waited)

    def replaced(self, reason: str) -> None:
        """The replica was taken out and another loaded in its place: ``reason`` is one of
        :data:`~actorserve.metrics.REPLACEMENTS` (Prometheus only: Triton has no such count)."""
        if self.metrics is not None:
            self.metrics.replacements[reason].inc()


@attrs.define
class RequestCounters:
    """One model version's requests: successes and failures with their total durations
    (accepted to answered), and when the last one arrived (ms since the epoch)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0

    def started(self) -> float:
        self.last_inference_ms = time.time_ns() // 1_000_000  # a timestamp, not a timer
        return trio.current_time()

    def ended(self, since: float, ok: bool) -> None:
        ns = elapsed_ns(since)
        if ok:
            self.success_count += 1
            self.success_ns += ns
        else:
            self.fail_count += 1
            self.fail_ns += ns
