"""The engine's gauges of live work, read from its hosts' statistics.

:func:`watch_engine` registers a refresher on the engine's :class:`~actorserve.metrics.Metrics`:
each refresh (before a scrape in the one-process shape; every second in the engine
process of the multi-process server) sets, per model version, the requests in flight, the
requests waiting for a batch slot, the slots held, the requests queued and running (and
the server's totals of both, for autoscalers and the Gateway API Inference Extension) and
the KV-cache usage its replicas report (:meth:`~actorserve.model.Model.kv_cache_usage`),
so a leak after a disconnect storm shows in ``/metrics`` as a gauge that does not return
to 0. A version that is no longer loaded is set to 0 once (its series stay, as
Prometheus series do).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import MutableSet

from ..actors.host import ModelHost
from ..actors.reports import model_statistics
from . import Engine

log = logging.getLogger(__name__)


def kv_cache_usage(host: ModelHost, complained: MutableSet[ModelHost] | None = None) -> float | None:
    """The mean over ``host``'s replicas of what they report (each clamped to 0..1); None
    when none keeps a KV cache. A replica whose hook raises counts as saying nothing
    (a scrape must not fail for a model's bug): logged once per host in ``complained``."""
    usages: list[float] = []
    for replica in list(host.replicas):
        try:
            usage = replica.kv_cache_usage()
        except Exception:
            if complained is None or host not in complained:
                log.exception("model %s version %s: kv_cache_usage() raised", host.name, host.version)
                if complained is not None:
                    complained.add(host)
            continue
        if usage is not None and not math.isnan(usage):
            usages.append(min(1.0, max(0.0, float(usage))))
    return sum(usages) / len(usages) if usages else None


def watch_engine(engine: Engine) -> None:
    """Keep ``engine.metrics``' live-work gauges from ``engine``'s hosts at each refresh."""
    metrics = engine.metrics
    shown: set[tuple[str, str]] = set()
    cached: set[tuple[str, str]] = set()  # the versions with a KV-cache usage series
    complained: weakref.WeakSet[ModelHost] = weakref.WeakSet()  # hooks that raised, logged once

    def refresh() -> None:
        seen: set[tuple[str, str]] = set()
        waiting = running = 0
        fullest = 0.0
        for host in engine.hosts():
            labels = (host.name, host.version)
            stats = model_statistics(host)
            metrics.model_in_flight.labels(*labels).set(stats.inflight)
            metrics.batch_waiting.labels(*labels).set(stats.waiting)
            metrics.batch_running.labels(*labels).set(stats.running)
            metrics.model_requests_waiting.labels(*labels).set(stats.waiting + stats.queued)
            metrics.model_requests_running.labels(*labels).set(stats.running)
            usage = kv_cache_usage(host, complained)
            if usage is not None:  # no series for a model without a KV cache
                metrics.model_kv_cache_usage.labels(*labels).set(usage)
                cached.add(labels)
                fullest = max(fullest, usage)
            waiting += stats.waiting + stats.queued
            running += stats.running
            seen.add(labels)
        metrics.requests_waiting.set(waiting)
        metrics.requests_running.set(running)
        metrics.kv_cache_usage.set(fullest)
        for labels in shown - seen:
            for gauge in (
                metrics.model_in_flight,
                metrics.batch_waiting,
                metrics.batch_running,
                metrics.model_requests_waiting,
                metrics.model_requests_running,
            ):
                gauge.labels(*labels).set(0)
            if labels in cached:  # only a model that reported a usage has the series
                metrics.model_kv_cache_usage.labels(*labels).set(0)
                cached.discard(labels)
        shown.clear()
        shown.update(seen)

    metrics.refreshers.append(refresh)


__all__ = ["kv_cache_usage", "watch_engine"]
