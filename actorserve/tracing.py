"""OpenTelemetry tracing, off by default (``--otel``): what the rest of the server calls,
without importing OpenTelemetry.

With tracing off nothing here imports ``opentelemetry`` and every request pays one
``if`` where a host starts its span (:attr:`Recorder.tracer
<actorserve.transport.exchange.Recorder.tracer>` is None) and one where the engine reads
the request's control record (its ``trace`` is None). With it on, :mod:`actorserve.otel`
(which needs the ``actorserve[otel]`` extra) does the work:

- each host (REST, gRPC) starts the request's span with the parent the client sent
  (W3C ``traceparent`` / ``tracestate``) and sets :data:`TRACE` to the span's own
  ``traceparent`` for the task serving the request;
- the engine every door is given (:class:`~actorserve.transport.owner.OwnerStamp`) writes
  :data:`TRACE` into the request's control record (``RequestControl.trace``), which
  crosses the engine link with the request's other controls;
- the engine's model host starts its span as that record's child
  (:func:`engine_span`), and a batched request's queue and batch spans are that span's
  children (:func:`item_trace`, fed by the batcher).
So one trace runs from the client through the front and the engine, in both process
shapes.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Final

from .modelsettings import SettingsError
from .tracecontext import TRACE, ItemTrace, StepCount

#: how long a stopping process waits for its last spans to be exported
FLUSH_TIMEOUT_MS: Final = 2000

if TYPE_CHECKING:
    from .otel import EngineSpan, RequestTracer
    from .types import InferenceRequest


def request_tracer(on: bool) -> RequestTracer | None:
    """The hosts' tracer when tracing is ``on``, else None (and nothing imported)."""
    if not on:
        return None
    tracer: RequestTracer = _otel().RequestTracer()
    return tracer


def _otel() -> ModuleType:
    """:mod:`actorserve.otel`; :class:`SettingsError` that says what to install if the
    ``otel`` extra is not."""
    try:
        return importlib.import_module(".otel", __package__)
    except ImportError as error:
        raise SettingsError(
            f"otel: tracing needs the otel extra (pip install -e '.[otel]'): {error}"
        ) from None


@contextmanager
def exporting(on: bool) -> Iterator[None]:
    """While inside, this process exports its spans (when ``on``): an SDK tracer provider
    made from the ``OTEL_*`` variables is installed unless the process has one already
    (an application that set up its own, a test's in-memory one), and flushed on the way
    out (the batch processor's last spans go out before the process ends; for at most
    :data:`FLUSH_TIMEOUT_MS`: an unreachable collector must not hold up a stop). It stays
    installed (a process has one provider for good), so a later server in the same
    process exports through it too; the SDK shuts it down at exit."""
    if not on:
        yield
        return
    provider = _otel().install_provider()
    try:
        yield
    finally:
        if provider is not None:
            provider.force_flush(FLUSH_TIMEOUT_MS)


def engine_span(request: InferenceRequest, trace: str, model: str, version: str) -> EngineSpan:
    """The engine's span of ``request`` (whose control record carries ``trace``), for
    ``model`` ``version``; the record's ``trace`` becomes the new span's, so the
    request's queue and batch spans are its children. The caller ends it."""
    from .otel import EngineSpan

    attributes: dict[str, str | int] = {
        "actorserve.model": model,
        "actorserve.version": version,
        "process.pid": os.getpid(),
    }
    return EngineSpan(request, trace, "actorserve.engine", attributes)


def link_span(request: InferenceRequest, trace: str) -> EngineSpan:
    """The front's span of ``request``'s hop over the engine link (kind CLIENT: from
    sending it to the engine process to its last response), a child of ``trace``; the
    record's ``trace`` becomes the new span's, so the engine's span is its child. The
    caller ends it."""
    from opentelemetry.trace import SpanKind

    from .otel import EngineSpan

    return EngineSpan(request, trace, "engine link", {"process.pid": os.getpid()}, SpanKind.CLIENT)


def item_trace(trace: str) -> ItemTrace:
    """The trace of a batched request whose control record carries ``trace``."""
    from .otel import BatchedItemTrace

    return BatchedItemTrace(trace)


__all__ = [
    "FLUSH_TIMEOUT_MS",
    "TRACE",
    "ItemTrace",
    "StepCount",
    "engine_span",
    "exporting",
    "item_trace",
    "link_span",
    "request_tracer",
]
