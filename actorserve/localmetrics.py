"""Histogram observations kept in plain lists in this process and added to their
prometheus-client series in one go (:class:`LocalHistogram`), for what is observed per
streamed response: see :class:`actorserve.metrics.Metrics` for when they are flushed."""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Histogram


class LocalHistogram:
    """Observations of one histogram series kept in plain lists, added to the series in
    one go by :meth:`flush`: a locked add per non-empty bucket and one for the sum, not
    two per observation (each a write to a memory-mapped file in multiprocess mode).
    For the observations made per streamed response."""

    __slots__ = ("_bounds", "_counts", "_sum", "_target", "pending")

    def __init__(self, target: Histogram) -> None:
        self._target = target
        self._bounds: list[float] = list(target._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self.pending = False

    def observe(self, amount: float, times: int = 1) -> None:
        """``times`` observations of ``amount`` (the bucket: the first bound >= amount)."""
        self._counts[bisect_left(self._bounds, amount)] += times
        self._sum += amount * times
        self.pending = True

    def flush(self) -> None:
        if self.pending:
            self._target._sum.inc(self._sum)
            for i, count in enumerate(self._counts):
                if count:
                    self._target._buckets[i].inc(count)
                    self._counts[i] = 0
            self._sum, self.pending = 0.0, False


__all__ = ["LocalHistogram"]
