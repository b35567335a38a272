"""One request as the metrics and the access log see it, for every transport.

A transport makes an :class:`Exchange` when a request arrives, fills in what it learns
(model, version, status, bytes, sequence id; :meth:`Exchange.responses` as a stream's
responses go out) and calls :meth:`Recorder.finish` once at the end. Only inference
requests (``inference=True``) count in the request metrics; every request gets an access
line when the access log is on.

Model labels stay bounded: a request for a model that does not exist is counted under
``model=""`` (its name came from the client), and a request that failed before a
version was chosen under the version it asked for, or ``""``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import trio

from ..metrics import InFlight, Metrics
from ..tracing import TRACE
from .access import AccessLog

if TYPE_CHECKING:
    from ..otel import RequestSpan, RequestTracer

#: the ASGI scope key under which the REST app keeps a request's :class:`Exchange`
#: (read by the shutdown's ``Drain`` to end a response it cut short)
EXCHANGE_KEY: Final = "actorserve.exchange"


class Exchange:
    """The facts of one request, filled in by the transport serving it (one task)."""

    __slots__ = (
        "bytes",
        "complete",
        "disconnected",
        "first_at",
        "headers",
        "in_flight",
        "inference",
        "last_at",
        "method",
        "model",
        "not_found",
        "recorder",
        "route",
        "sequence_id",
        "span",
        "started",
        "status",
        "stream_error",
        "transport",
        "version",
    )

    def __init__(self, transport: str, method: str, route: str) -> None:
        self.transport = transport
        self.method = method
        self.route = route
        self.started = trio.current_time()
        self.inference = False
        self.model: str | None = None
        self.version: str | None = None
        #: HTTP status, or for gRPC the name of the status ("OK", "NOT_FOUND", ...)
        self.status: int | str = 0
        #: body bytes sent (None: not known, as for gRPC)
        self.bytes: int | None = 0
        #: the request named a model that does not exist
        self.not_found = False
        #: the client went away (counts only if the answer was not ``complete``)
        self.disconnected = False
        self.complete = False
        #: the response's headers, once it started (REST)
        self.headers: Any = ()
        #: the status an error inside a started stream would have had
        self.stream_error: int | None = None
        self.sequence_id: str | None = None
        self.first_at: float | None = None
        self.last_at = 0.0
        #: the in-flight gauge this exchange counts in, from :meth:`Recorder.open` to its finish
        self.in_flight: InFlight | None = None
        #: the host's recorder, which finishes this exchange: :meth:`model_request` opens it
        self.recorder: Recorder | None = None
        #: the request's span (tracing on: :attr:`Recorder.tracer` started it), ended by the finish
        self.span: RequestSpan | None = None

    def note_disconnect(self) -> None:
        """The client went away (for :func:`~actorserve.transport.receive.cancel_on_disconnect`)."""
        self.disconnected = True

    def model_request(self, model: str, version: str | None) -> None:
        """This is an inference request for ``model`` (``version``: as asked): it counts
        in the request metrics, and from now in the in-flight gauge (when the host that
        finishes it gave it its :attr:`recorder`)."""
        self.inference = True
        self.model = model
        self.version = version
        if self.recorder is not None:
            self.recorder.open(self)

    def outcome(self) -> int | None:
        """The HTTP status the outcome is judged by (an error inside a stream that started
        200 counts as that error), or None if the client went away."""
        if self.disconnected and not self.complete:
            return None
        if self.stream_error is not None:
            return self.stream_error
        if not isinstance(self.status, int):
            return None
        return self.status or 500  # nothing was sent: the server failed to answer

    def answered(self, version: str | None, sequence_id: object = None) -> None:
        """A response named the version that served it and its sequence."""
        if version:
            self.version = version
        if sequence_id is not None and sequence_id != "":
            self.sequence_id = str(sequence_id)


class Recorder:
    """Turns finished exchanges into metrics, access lines and spans. One per transport
    instance; ``access`` is None when the access log is off, ``tracer`` when tracing is
    (:func:`actorserve.tracing.request_tracer`: the host starts each request's span with
    it, :meth:`finish` ends it)."""

    __slots__ = ("access", "metrics", "tracer")

    def __init__(
        self, metrics: Metrics, access: AccessLog | None = None, tracer: RequestTracer | None = None
    ) -> None:
        self.metrics = metrics
        self.access = access
        self.tracer = tracer

    def open(self, exchange: Exchange) -> None:
        """``exchange`` is an inference request being served: it counts in
        ``actorserve_requests_in_flight`` until :meth:`finish` (call it once the request
        is known to be one, with nothing that can raise between it and the ``finally``
        that finishes)."""
        if exchange.in_flight is None:
            counter = self.metrics.in_flight(exchange.transport)
            counter.count += 1
            exchange.in_flight = counter

    def traced_part(self, exchange: Exchange, name: str) -> None:
        """With tracing on, ``exchange`` (one request of a call that carries many, as a
        gRPC ``ModelStreamInfer``) gets a span ``name`` of its own, a child of the call's
        (this task's :data:`~actorserve.tracing.TRACE`), ended by :meth:`finish`; call it
        in the task that finishes the exchange, before the request goes to the engine."""
        if self.tracer is not None:
            exchange.span = self.tracer.start(name, exchange.transport, {}, TRACE.get(), None)

    def responses(self, exchange: Exchange, count: int) -> None:
        """``count`` responses of a stream went out together just now: the first ever is
        the time to first response; the gap since the last batch is one time between
        responses, and the others of the batch arrived together (a gap of 0)."""
        if not count or not exchange.inference or exchange.model is None:
            return
        now = trio.current_time()
        series = self.metrics.front(exchange.model, exchange.version or "", exchange.transport)
        if exchange.first_at is None:
            exchange.first_at = now
            series.first_response.observe(now - exchange.started)
            if exchange.span is not None:
                exchange.span.first_response()
        else:
            series.between_responses.observe(now - exchange.last_at)
        if count > 1:
            series.between_responses.observe(0.0, count - 1)
        exchange.last_at = now

    def finish(self, exchange: Exchange, outcome_status: int | None) -> None:
        """The request is over. ``outcome_status``: the HTTP status its outcome is judged
        by (gRPC: the one the same error has over REST), or None when the client went
        away first."""
        now = trio.current_time()
        if exchange.in_flight is not None:
            exchange.in_flight.count -= 1
            exchange.in_flight = None
        if exchange.first_at is not None:  # a stream: its gaps so far were kept locally
            self.metrics.flush()
        if exchange.inference and exchange.model is not None:
            not_found = exchange.not_found
            model = "" if not_found else exchange.model
            version = "" if not_found else exchange.version or ""
            if outcome_status is None:
                self.metrics.disconnected(model, version, exchange.transport)
            else:
                self.metrics.request(
                    model, version, exchange.transport, outcome_status, now - exchange.started
                )
        if exchange.span is not None:
            span, exchange.span = exchange.span, None
            span.finish(
                exchange.model, exchange.version, exchange.sequence_id, exchange.status, outcome_status
            )
        if self.access is not None:
            self.access.add(
                (
                    time.time(),
                    exchange.transport,
                    exchange.method,
                    exchange.route,
                    "disconnected" if outcome_status is None else exchange.status,
                    exchange.bytes,
                    round((now - exchange.started) * 1000, 3),
                    exchange.model,
                    exchange.version,
                    exchange.sequence_id,
                )
            )


__all__ = ["EXCHANGE_KEY", "Exchange", "Recorder"]
