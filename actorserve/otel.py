"""The spans themselves, made with OpenTelemetry's API (the ``actorserve[otel]`` extra).

Imported only when tracing is on (:mod:`actorserve.tracing` says who calls what); every
other module reaches OpenTelemetry through there. Spans:

- a host's request span (:class:`RequestTracer`, kind SERVER), parent from the
  client's W3C ``traceparent`` / ``tracestate``; event ``first_response`` on a stream;
- the engine's span of the request (:class:`EngineSpan`), a child of the request span
  whichever process the engine runs in;
- a batched request's ``queue`` (submitted to admitted) and ``batch`` (admitted to done:
  steps joined, responses made) spans (:class:`BatchedItemTrace`), children of the
  engine's span.

Times: a span's start and end are wall-clock nanoseconds (``time.time_ns``); a duration
the server measured on trio's clock is placed back from the moment it is recorded.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .tracecontext import TRACE, StepCount

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from .types import InferenceRequest

log = logging.getLogger(__name__)

#: the instrumentation scope every span of the server is made under
SCOPE: Final = "actorserve"
_PROPAGATOR: Final = TraceContextTextMapPropagator()
_SEQUENCE_LABEL: Final = b"actorserve sequence id\0"


def install_provider() -> TracerProvider | None:
    """An SDK tracer provider exporting as the standard variables say, installed as this
    process's; None (nothing installed) when the process has a provider already.

    ``OTEL_TRACES_EXPORTER``: ``otlp`` (default), ``console``, ``none``, or several
    comma-separated; OTLP speaks ``http/protobuf`` unless ``OTEL_EXPORTER_OTLP_PROTOCOL``
    (or ``..._TRACES_PROTOCOL``) says ``grpc`` (which needs
    ``opentelemetry-exporter-otlp-proto-grpc``); the exporter reads its endpoint, headers
    and timeout from ``OTEL_EXPORTER_OTLP_*`` itself. ``OTEL_SERVICE_NAME`` (default
    ``actorserve``) and ``OTEL_RESOURCE_ATTRIBUTES`` name the resource."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    service = os.environ.get("OTEL_SERVICE_NAME") or "actorserve"
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        name = name.strip().lower()
        exporter: Any
        if name == "otlp":
            exporter = _otlp_exporter()
        elif name == "console":
            exporter = ConsoleSpanExporter()
        elif name in ("none", ""):
            continue
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r, ignored (otlp, console or none)", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def _otlp_exporter() -> Any:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    module = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
    if protocol.strip() != "grpc":
        module = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    return importlib.import_module(module).OTLPSpanExporter()


def sequence_hash(sequence_id: str) -> str:
    """What a span says of a sequence id: 64 bits of SHA-256 over a label and the id. The
    id is a bearer secret (whoever has it can continue the sequence) and never goes into
    a trace; its hash ties a sequence's requests together."""
    return hashlib.sha256(_SEQUENCE_LABEL + sequence_id.encode()).hexdigest()[:16]


def _context_of(traceparent: str | None, tracestate: str | None = None) -> Context:
    carrier = {}
    if traceparent is not None:
        carrier["traceparent"] = traceparent
        if tracestate is not None:
            carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def traceparent_of(span: Span) -> str | None:
    """The W3C ``traceparent`` naming ``span`` as the parent (None: not a valid span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _wall_ns(at: float, now: float, now_ns: int) -> int:
    """The wall-clock ns of trio time ``at``, given that trio time ``now`` is ``now_ns``."""
    return now_ns - max(0, int((now - at) * 1e9))


class RequestTracer:
    """Starts the request spans of one host (REST or gRPC)."""

    __slots__ = ("tracer",)

    def __init__(self) -> None:
        self.tracer = trace.get_tracer(SCOPE)

    def start(
        self,
        name: str,
        transport: str,
        attributes: dict[str, str],
        traceparent: str | None,
        tracestate: str | None,
    ) -> RequestSpan:
        """A request span, child of the client's ``traceparent`` (a malformed one starts a
        new trace, as the W3C spec says); :data:`TRACE` names it for this task until
        :meth:`RequestSpan.finish`."""
        span = self.tracer.start_span(
            name,
            context=_context_of(traceparent, tracestate),
            kind=SpanKind.SERVER,
            attributes={"actorserve.transport": transport, **attributes},
        )
        return RequestSpan(span, name, TRACE.set(traceparent_of(span)))


class RequestSpan:
    """One request's span at its host; ended by :meth:`finish` (in the task that
    started it: it resets :data:`TRACE`)."""

    __slots__ = ("name", "reset", "span")

    def __init__(self, span: Span, name: str, reset: Any) -> None:
        self.span = span
        self.name = name
        self.reset = reset

    def first_response(self) -> None:
        self.span.add_event("first_response")

    def finish(
        self,
        model: str | None,
        version: str | None,
        sequence_id: str | None,
        status: int | str,
        outcome: int | None,
    ) -> None:
        """End the span: the request was for ``model`` ``version`` (None: no model),
        answered ``status`` (HTTP, or the gRPC status' name); ``outcome``: the HTTP
        status it is judged by, None when the client went away first."""
        TRACE.reset(self.reset)
        span = self.span
        if model is not None:
            span.set_attribute("actorserve.model", model)
            span.update_name(_route_name(self.name, model, version))
            if version:
                span.set_attribute("actorserve.version", version)
        elif " /" in self.name:  # a REST path with no model: the method alone (a path is the client's)
            span.update_name(self.name.partition(" ")[0])
        if sequence_id is not None:
            span.set_attribute("actorserve.sequence.hash", sequence_hash(sequence_id))
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
        else:
            span.set_attribute("rpc.grpc.status", status)
        if outcome is None:
            span.set_attribute("actorserve.disconnected", True)
        elif outcome >= 500:
            span.set_status(Status(StatusCode.ERROR, str(status)))
        span.end()


def _route_name(name: str, model: str, version: str | None) -> str:
    """A REST span's name with the model (and version) replaced by their placeholders:
    ``POST /v2/models/{model}/infer`` (span names stay few, the attributes say which)."""
    if " /" not in name or not model:
        return name
    method, _, path = name.partition(" ")
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part == model and i > 0 and parts[i - 1] in ("models", "predictions", "explanations"):
            parts[i] = "{model}"
        elif version and part == version and i > 0 and parts[i - 1] in ("versions", "{model}"):
            parts[i] = "{version}"
    return f"{method} {'/'.join(parts)}"


class EngineSpan:
    """A span of one request on its way through the engine, whose children the request's
    later spans are: the engine's (:func:`actorserve.tracing.engine_span`), or the
    front's hop over the engine link (:func:`actorserve.tracing.link_span`)."""

    __slots__ = ("span",)

    def __init__(
        self,
        request: InferenceRequest,
        trace_parent: str,
        name: str,
        attributes: dict[str, str | int],
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> None:
        self.span = trace.get_tracer(SCOPE).start_span(
            name, context=_context_of(trace_parent), kind=kind, attributes=attributes
        )
        control = request.control
        if control is not None:
            request.control = attrs.evolve(control, trace=traceparent_of(self.span))

    def end(self, ok: bool) -> None:
        if not ok:
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()


class BatchedItemTrace:
    """A batched request's ``queue`` and ``batch`` spans, made when it leaves (its
    batcher calls :meth:`admitted`, its :class:`~actorserve.actors.workitem.WorkItem`
    :meth:`finished`)."""

    __slots__ = ("admitted_ns", "counts", "parent", "steps_at")

    def __init__(self, trace_parent: str) -> None:
        self.parent = _context_of(trace_parent)
        self.admitted_ns = 0
        self.counts: StepCount | None = None
        self.steps_at = 0

    def admitted(self, counts: StepCount) -> None:
        self.admitted_ns = time.time_ns()
        self.counts = counts
        self.steps_at = counts.steps

    def finished(self, submitted_at: float, responses: int, error: BaseException | None) -> None:
        now_ns = time.time_ns()
        tracer = trace.get_tracer(SCOPE)
        if submitted_at:
            queued_ns = _wall_ns(submitted_at, trio.current_time(), now_ns)
            end = self.admitted_ns or now_ns
            queue = tracer.start_span("queue", context=self.parent, start_time=min(queued_ns, end))
            queue.set_attribute("actorserve.admitted", bool(self.admitted_ns))
            queue.end(end_time=end)
        if self.admitted_ns and self.counts is not None:
            batch = tracer.start_span("batch", context=self.parent, start_time=self.admitted_ns)
            batch.set_attribute("actorserve.batch.steps", self.counts.steps - self.steps_at)
            batch.set_attribute("actorserve.batch.responses", responses)
            if error is not None:
                batch.set_status(Status(StatusCode.ERROR, type(error).__name__))
            batch.end(end_time=now_ns)


__all__ = [
    "SCOPE",
    "BatchedItemTrace",
    "EngineSpan",
    "RequestSpan",
    "RequestTracer",
    "install_provider",
    "sequence_hash",
    "traceparent_of",
]
