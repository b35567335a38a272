"""A baseline for the few tests that bound how long something may take: how fast this
machine runs Python *now*. A test asserts behaviour, not speed; where a stall is the
behaviour under test (a probe held up by an attack, a stop that should be at once), its
bound is a wide multiple of this pace, measured in the same test, so a machine slowed by
other work widens the bound instead of failing the test."""

from __future__ import annotations

import json
import statistics
import time

#: a fixed piece of pure-Python work (parsing, arithmetic): ~10 ms on an idle core here
_DOCUMENT = json.dumps([{"k": i, "v": [i, str(i)]} for i in range(20_000)])


def _work() -> float:
    started = time.perf_counter()
    json.loads(_DOCUMENT)
    sum(i * i for i in range(100_000))
    return time.perf_counter() - started


def pace(rounds: int = 5) -> float:
    """Seconds the fixed work takes on this machine now: the median of ``rounds`` runs
    (about 10 ms on an idle core of the development machine; blocks the caller for
    ``rounds`` of them)."""
    return statistics.median(_work() for _ in range(rounds))
