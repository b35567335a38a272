"""The engine's gauges of live work, read from its hosts' statistics.

:func:`watch_engine` registers a refresher on the engine's :class:`~actorserve.metrics.Metrics`:
each refresh (before a scrape in the one-process shape; every second in the engine
process of the multi-process server) sets, per model version, the requests in flight, the
requests waiting for a batch slot and the slots held (and the server's totals of both,
for autoscalers and the Gateway API Inference Extension), so a leak after a disconnect storm
shows in ``/metrics`` as a gauge that does not return to 0. A version that is no longer
loaded is set to 0 once (its series stay, as Prometheus series do).
"""

from __future__ import annotations

from ..actors.reports import model_statistics
from . import Engine


def watch_engine(engine: Engine) -> None:
    """Keep ``engine.metrics``' live-work gauges from ``engine``'s hosts at each refresh."""
    metrics = engine.metrics
    shown: set[tuple[str, str]] = set()

    def refresh() -> None:
        seen: set[tuple[str, str]] = set()
        waiting = running = 0
        for host in engine.hosts():
            labels = (host.name, host.version)
            stats = model_statistics(host)
            metrics.model_in_flight.labels(*labels).set(stats.inflight)
            metrics.batch_waiting.labels(*labels).set(stats.waiting)
            metrics.batch_running.labels(*labels).set(stats.running)
            waiting += stats.waiting + stats.queued
            running += stats.running
            seen.add(labels)
        metrics.requests_waiting.set(waiting)
        metrics.requests_running.set(running)
        for labels in shown - seen:
            for gauge in (metrics.model_in_flight, metrics.batch_waiting, metrics.batch_running):
                gauge.labels(*labels).set(0)
        shown.clear()
        shown.update(seen)

    metrics.refreshers.append(refresh)


__all__ = ["watch_engine"]
