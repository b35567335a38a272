"""Prometheus metrics: the families, who records what, and how ``GET /metrics`` collects.

One :class:`Metrics` per server (never a module global): the engine records through the
:class:`ModelMetrics` of each model version (labels resolved once, when the model loads),
the transports through :meth:`Metrics.front` (labels resolved once per model, version,
transport and outcome, then cached), and ``GET /metrics`` calls :meth:`Metrics.expose`.
Every name, unit and label is listed in ``docs/metrics.md``.

Process shapes. In one process (``--api-workers 0``, embedded :func:`actorserve.serve`)
the values live in this process and :meth:`expose` reads them. In the multi-process server
the parent makes a folder and hands it to every child as ``PROMETHEUS_MULTIPROC_DIR``
(prometheus-client's multiprocess mode, chosen when prometheus-client is first imported):
each process writes its values to its own memory-mapped files there, and the front that
answers a scrape sums every process's files (:class:`~prometheus_client.multiprocess.MultiProcessCollector`),
so the numbers are the server's, not one process's. Gauges say how processes combine
(``livesum``: the sum over the processes alive now).

Recording costs a dict lookup and a locked add (a few microseconds in multiprocess mode,
see ``docs/metrics.md`` for the measurement); nothing here does I/O on the request path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final

import attrs
import prometheus_client
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from .api import EndReason
from .localmetrics import LocalHistogram
from .process_metrics import ProcessCollector, count_tasks

#: The variable naming the multiprocess folder (prometheus-client's own).
MULTIPROC_VAR: Final = "PROMETHEUS_MULTIPROC_DIR"

#: ``Content-Type`` of the exposition: the text format 0.0.4, which every Prometheus reads
#: (prometheus-client 0.22+ calls 1.0.0 its latest).
CONTENT_TYPE: Final[str] = getattr(
    prometheus_client, "CONTENT_TYPE_PLAIN_0_0_4", prometheus_client.CONTENT_TYPE_LATEST
)

#: seconds: from half a millisecond (a unary identity call) to a minute (a long stream).
DURATION_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: seconds between two responses of a stream, or of one model step.
STEP_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
#: items in one step.
BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: ``outcome`` of a request, by HTTP status class (the one error table decides the status).
OUTCOMES: Final = ("success", "invalid", "overloaded", "unavailable", "failed", "disconnected")

#: ``reason`` of a rejection: which bound was full.
REJECTIONS: Final = ("mailbox_full", "max_pending", "max_sequences")
#: ``reason`` of a replica replacement: a step hung (step_timeout), or max_requests_per_replica
REPLACEMENTS: Final = ("hung", "recycled")

#: seconds between two refreshes of the gauges read from live state (:meth:`Metrics.keep_fresh`)
REFRESH_INTERVAL: Final = 1.0

MODEL_LABELS: Final = ("model", "version")
FRONT_LABELS: Final = ("model", "version", "transport")


def outcome_of(status: int) -> str:
    """The ``outcome`` label of an HTTP status (gRPC calls use the status the same error
    has over REST)."""
    if status < 400:
        return "success"
    if status == 429:
        return "overloaded"
    if status == 503:
        return "unavailable"
    if status < 500:
        return "invalid"
    return "failed"


def multiprocess_dir() -> Path | None:
    """The multiprocess folder of this process, or None (values live in this process)."""
    folder = os.environ.get(MULTIPROC_VAR)
    return Path(folder) if folder else None


@attrs.frozen(slots=True)
class ModelMetrics:
    """The engine-side series of one model version, labels already resolved (cheap to
    record: no lookup). Made by :meth:`Metrics.model`."""

    queue_time: Histogram
    batch_size: Histogram
    step_duration: Histogram
    sequences_open: Gauge
    sequences_started: Counter
    sequences_ended: Mapping[str, Counter]
    rejected: Mapping[str, Counter]
    replacements: Mapping[str, Counter]

    def step(self, items: int, seconds: float) -> None:
        self.batch_size.observe(items)
        self.step_duration.observe(seconds)

    def reject(self, reason: str) -> None:
        counter = self.rejected.get(reason)
        if counter is not None:
            counter.inc()


class FrontSeries:
    """The transport-side series of one (model, version, transport); the stream
    histograms are made when a stream first records, so unary-only models show none."""

    __slots__ = ("_between", "_first", "_labels", "_metrics", "duration", "outcomes")

    def __init__(self, metrics: Metrics, labels: tuple[str, str, str]) -> None:
        self._metrics = metrics
        self._labels = labels
        self.duration: Histogram = metrics.request_duration.labels(*labels)
        self.outcomes: dict[str, Counter] = {o: metrics.requests.labels(*labels, o) for o in OUTCOMES}
        self._first: Histogram | None = None
        self._between: LocalHistogram | None = None

    @property
    def first_response(self) -> Histogram:
        if self._first is None:
            self._first = self._metrics.first_response.labels(*self._labels)
        return self._first

    @property
    def between_responses(self) -> LocalHistogram:
        """Kept locally: flushed when a stream ends and at each :meth:`Metrics.refresh`."""
        if self._between is None:
            self._between = LocalHistogram(self._metrics.between_responses.labels(*self._labels))
            self._metrics.local.append(self._between)
        return self._between


class InFlight:
    """Requests a transport is serving now (see :meth:`Metrics.in_flight`)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class Metrics:
    """Every metric family of one server, and how to expose them.

    Create one per server (or per process of the multi-process server) after the
    process's ``PROMETHEUS_MULTIPROC_DIR`` is settled."""

    def __init__(self) -> None:
        # One exposition for both shapes: multiprocess mode has no ``_created`` series.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.folder = multiprocess_dir()
        self.registry = CollectorRegistry(auto_describe=False)
        own = None if self.folder is not None else self.registry
        if self.folder is not None:
            MultiProcessCollector(self.registry, path=str(self.folder))  # type: ignore[no-untyped-call]
        self.registry.register(ProcessCollector(self.folder))

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, doc, labels, registry=own)

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: Iterable[float]) -> Histogram:
            return Histogram(name, doc, labels, registry=own, buckets=tuple(buckets))

        # -- front side (the transports) --
        self.requests = counter(
            "actorserve_requests",
            "Inference requests answered, by outcome and transport.",
            (*FRONT_LABELS, "outcome"),
        )
        self.request_duration = histogram(
            "actorserve_request_duration_seconds",
            "Time from a request's arrival to its last response (streams: to the end of the stream).",
            FRONT_LABELS,
            DURATION_BUCKETS,
        )
        self.first_response = histogram(
            "actorserve_time_to_first_response_seconds",
            "Streams: time from the request's arrival to its first response.",
            FRONT_LABELS,
            DURATION_BUCKETS,
        )
        self.between_responses = histogram(
            "actorserve_time_between_responses_seconds",
            "Streams: time between two responses of one stream, as delivered to the transport.",
            FRONT_LABELS,
            STEP_BUCKETS,
        )
        # -- engine side (the actors) --
        self.queue_time = histogram(
            "actorserve_queue_duration_seconds",
            "BatchModel: time a request waited for a batch slot.",
            MODEL_LABELS,
            DURATION_BUCKETS,
        )
        self.batch_size = histogram(
            "actorserve_batch_size",
            "BatchModel: items stepped together in one step.",
            MODEL_LABELS,
            BATCH_BUCKETS,
        )
        self.step_duration = histogram(
            "actorserve_step_duration_seconds",
            "BatchModel: time of one model step.",
            MODEL_LABELS,
            STEP_BUCKETS,
        )
        self.sequences_open = Gauge(
            "actorserve_sequences_open",
            "Stateful sequences open now.",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livesum",
        )
        self.sequences_started = counter(
            "actorserve_sequences_started", "Stateful sequences started.", MODEL_LABELS
        )
        self.sequences_ended = counter(
            "actorserve_sequences_ended", "Stateful sequences ended, by reason.", (*MODEL_LABELS, "reason")
        )
        self.rejected = counter(
            "actorserve_rejected_requests",
            "Requests refused because a bound was full (each also answered 429 / RESOURCE_EXHAUSTED).",
            (*MODEL_LABELS, "reason"),
        )
        self.replacements = counter(
            "actorserve_replica_replacements",
            "BatchModel replicas replaced, by reason.",
            (*MODEL_LABELS, "reason"),
        )
        # -- read from live state (:meth:`refresh`) or kept by the transports --
        self.requests_in_flight = Gauge(
            "actorserve_requests_in_flight",
            "Inference requests the transports are serving now (arrived, not yet answered).",
            ("transport",),
            registry=own,
            multiprocess_mode="livesum",
        )
        self.model_in_flight = Gauge(
            "actorserve_model_requests_in_flight",
            "Requests a model version accepted and has not answered yet.",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livesum",
        )
        self.batch_waiting = Gauge(
            "actorserve_batch_waiting",
            "BatchModel: requests waiting for a batch slot.",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livesum",
        )
        self.batch_running = Gauge(
            "actorserve_batch_running",
            "Batch slots held now: BatchModel items in the running batch (plain models: requests inside predict).",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livesum",
        )
        # what a scrape behind a proxy says about where it came from (set by serve_transports)
        self.replica_info = Gauge(
            "actorserve_replica_info",
            "Always 1; label replica: this server's --replica-id (docs/deploy.md#replica-identity).",
            ("replica",),
            registry=own,
            multiprocess_mode="max",
        )
        # the server's totals under the Gateway API Inference Extension's model-server
        # protocol (TotalQueuedRequests, TotalRunningRequests; vLLM's names, our prefix)
        self.requests_waiting = Gauge(
            "actorserve_num_requests_waiting",
            "Requests queued in every model: waiting for a batch slot or behind their sequence's running one.",
            registry=own,
            multiprocess_mode="livesum",
        )
        self.requests_running = Gauge(
            "actorserve_num_requests_running",
            "Requests being served in every model (batch slots held; plain models: inside predict).",
            registry=own,
            multiprocess_mode="livesum",
        )
        # the same per model version: an InferencePool's endpoint picker selects its
        # model's series with a label matcher (docs/deploy.md#gateway-api-inference-extension)
        self.model_requests_waiting = Gauge(
            "actorserve_model_num_requests_waiting",
            "Requests queued in a model version: waiting for a batch slot or behind their sequence's running one.",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livesum",
        )
        self.model_requests_running = Gauge(
            "actorserve_model_num_requests_running",
            "Requests being served in a model version (batch slots held; plain models: inside predict).",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livesum",
        )
        self.model_kv_cache_usage = Gauge(
            "actorserve_model_kv_cache_usage_ratio",
            "LLM runtimes: the fraction (0 to 1) of a model version's KV cache in use (the mean over its replicas).",
            MODEL_LABELS,
            registry=own,
            multiprocess_mode="livemax",
        )
        self.kv_cache_usage = Gauge(
            "actorserve_kv_cache_usage_ratio",
            "LLM runtimes: the fullest model version's KV cache usage (0 to 1); 0 with no LLM loaded.",
            registry=own,
            multiprocess_mode="livemax",
        )
        self.draining = Gauge(
            "actorserve_draining",
            "1 while a SIGTERM'd server serves only its open sequences (--drain-timeout), else 0.",
            registry=own,
            multiprocess_mode="max",
        )
        self.tasks = Gauge(
            "actorserve_tasks",
            "trio tasks alive in the server's processes (multi-process: one series per process, label pid).",
            registry=own,
            multiprocess_mode="liveall",
        )
        #: called on the trio thread by :meth:`refresh`: each sets gauges from live state
        self.refreshers: list[Callable[[], None]] = [self._count_tasks, self.flush]
        #: the per-response histograms kept in this process until :meth:`flush`
        self.local: list[LocalHistogram] = []
        self._fronts: dict[tuple[str, str, str], FrontSeries] = {}
        self._in_flight: dict[str, InFlight] = {}

    @property
    def multiprocess(self) -> bool:
        return self.folder is not None

    def model(self, name: str, version: str) -> ModelMetrics:
        """The engine-side series of a model version (every label value made now, so a
        dashboard sees zeros rather than no series)."""
        return ModelMetrics(
            queue_time=self.queue_time.labels(name, version),
            batch_size=self.batch_size.labels(name, version),
            step_duration=self.step_duration.labels(name, version),
            sequences_open=self.sequences_open.labels(name, version),
            sequences_started=self.sequences_started.labels(name, version),
            sequences_ended={r.value: self.sequences_ended.labels(name, version, r.value) for r in EndReason},
            rejected={r: self.rejected.labels(name, version, r) for r in REJECTIONS},
            replacements={r: self.replacements.labels(name, version, r) for r in REPLACEMENTS},
        )

    def front(self, model: str, version: str, transport: str) -> FrontSeries:
        """The series of a transport for one model version (cached: one dict lookup)."""
        key = (model, version, transport)
        series = self._fronts.get(key)
        if series is None:
            series = FrontSeries(self, key)
            self._fronts[key] = series
        return series

    def in_flight(self, transport: str) -> InFlight:
        """The in-flight count of a transport: a plain counter on the request path (a
        multiprocess gauge write costs several microseconds, twice per request), copied
        into ``actorserve_requests_in_flight`` at each :meth:`refresh`."""
        count = self._in_flight.get(transport)
        if count is None:
            count = self._in_flight[transport] = InFlight()
            gauge = self.requests_in_flight.labels(transport)
            self.refreshers.append(lambda: gauge.set(count.count))
        return count

    def request(self, model: str, version: str, transport: str, status: int, seconds: float) -> None:
        """One request answered with (HTTP) ``status`` after ``seconds``."""
        series = self.front(model, version, transport)
        series.outcomes[outcome_of(status)].inc()
        series.duration.observe(seconds)

    def disconnected(self, model: str, version: str, transport: str) -> None:
        """The client went away before its answer was complete."""
        self.front(model, version, transport).outcomes["disconnected"].inc()

    def flush(self) -> None:
        """Add what the :class:`LocalHistogram` s hold to their series."""
        for histogram in self.local:
            if histogram.pending:
                histogram.flush()

    def refresh(self) -> None:
        """Set the gauges read from live state and :meth:`flush` (on the trio thread:
        before a scrape, and every :data:`REFRESH_INTERVAL` from :meth:`keep_fresh`)."""
        for refresher in self.refreshers:
            refresher()

    async def keep_fresh(self, interval: float = REFRESH_INTERVAL) -> None:
        """:meth:`refresh` every ``interval`` seconds until cancelled: in the multi-process
        server a scrape reads the other processes' values from their files, so each
        process keeps its own up to date (at most ``interval`` old)."""
        while True:
            self.refresh()
            await trio.sleep(interval)

    def _count_tasks(self) -> None:
        self.tasks.set(count_tasks())

    def expose(self) -> bytes:
        """The Prometheus text exposition of the server."""
        return prometheus_client.generate_latest(self.registry)


__all__ = [
    "CONTENT_TYPE",
    "MULTIPROC_VAR",
    "OUTCOMES",
    "REJECTIONS",
    "REPLACEMENTS",
    "FrontSeries",
    "InFlight",
    "LocalHistogram",
    "Metrics",
    "ModelMetrics",
    "ProcessCollector",
    "count_tasks",
    "multiprocess_dir",
    "outcome_of",
]
