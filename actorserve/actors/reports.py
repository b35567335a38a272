"""What a :class:`ModelHost` tells the APIs: its metadata, its description (workers,
batch settings, sequences, queue depths, state) and Triton's inference statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..api import ModelInfo, ModelMetadata, ModelStatistics, TensorMetadata
from ..declarations import declared_parameters, text_generation_of
from ..descriptions import (
    BatchStatistics,
    Duration,
    InferenceStatistics,
    ModelDescription,
    ReplicaDescription,
)
from ..model import BatchModel
from .plain import PlainRunner

if TYPE_CHECKING:
    from .host import ModelHost


def _implementation(host: ModelHost) -> str:
    cls = host.model_class
    return f"{cls.__module__}.{cls.__qualname__}"


def info(host: ModelHost) -> ModelInfo:
    """What ``GET /v2/models/{name}`` and the model lists say of ``host``."""
    model = host.replicas[0] if host.replicas else None
    return ModelInfo(
        name=host.name,
        version=host.version,
        state=host.state,
        batched=host.batched,
        stream_input=bool(host.model_class.stream_input),
        workers=host.settings.workers,
        max_batch_size=model.max_batch_size if isinstance(model, BatchModel) else 0,
        reason=host.reason,
        text_generation=text_generation_of(host.settings, host.model_class),
    )


def metadata(host: ModelHost, *, versions: tuple[str, ...]) -> ModelMetadata:
    """``host``'s metadata as the model gives it (``Model.metadata``), with the
    settings' ``any_datatype`` marks and what the model declares about its requests
    (:mod:`actorserve.declarations`); the engine knows the versions around it."""
    meta = host.metadata()
    specs = (*host.settings.inputs, *host.settings.outputs)
    any_datatype = frozenset(s.name for s in specs if s.any_datatype)
    return ModelMetadata(
        name=str(meta.get("name", host.name)),
        versions=versions,
        platform=str(meta.get("platform", "")),
        inputs=tuple(_tensor_metadata(t, any_datatype) for t in meta.get("inputs", ())),
        outputs=tuple(_tensor_metadata(t, any_datatype) for t in meta.get("outputs", ())),
        parameters={**declared_parameters(host.settings, host.model_class), **_shown(meta.get("parameters"))},
    )


def _shown(parameters: Any) -> dict[str, str | bool]:
    """What a model's own ``metadata()`` shows under ``parameters`` (strings and booleans:
    e.g. the dtype an LLM runs in)."""
    if not isinstance(parameters, dict):
        return {}
    return {str(k): v for k, v in parameters.items() if isinstance(v, str | bool)}


def _tensor_metadata(spec: Any, any_datatype: frozenset[str]) -> TensorMetadata:
    name = str(spec["name"])
    return TensorMetadata(
        name, str(spec.get("datatype", "")), tuple(spec.get("shape", ())), name in any_datatype
    )


def describe(host: ModelHost, *, default_version: str, versions: tuple[str, ...]) -> ModelDescription:
    """``host`` as :class:`ModelDescription`; the engine knows the versions around it."""
    settings, supervisor = host.settings, host.supervisor
    replicas: list[ReplicaDescription] = []
    for index, batcher in enumerate(host.batchers):
        stats = batcher.statistics()
        pinned = supervisor.pinned_count(batcher) if supervisor is not None else 0
        replicas.append(ReplicaDescription(index, stats.waiting, stats.running, pinned))
    runner = host.runner
    if isinstance(runner, PlainRunner):
        replicas = [ReplicaDescription(i, 0, runner.load_of(i), 0) for i in range(runner.active)]
    sequences = supervisor.statistics() if supervisor is not None else None
    model = host.replicas[0] if host.replicas else None
    sequence = settings.sequence
    return ModelDescription(
        name=host.name,
        version=host.version,
        state=str(host.state),
        reason=host.reason,
        default_version=default_version,
        versions=versions,
        implementation=_implementation(host),
        platform=settings.platform,
        batched=host.batched,
        workers=settings.workers,
        max_batch_size=model.max_batch_size if isinstance(model, BatchModel) else 0,
        max_batch_time=settings.max_batch_time,
        max_pending=settings.max_pending,
        idle_timeout_ms=sequence.idle_timeout_ms,
        max_duration_ms=sequence.max_duration_ms,
        max_queue=sequence.max_queue,
        max_sequences=sequence.max_sequences,
        evict_idle=sequence.evict_idle,
        open_sequences=sequences.open_sequences if sequences is not None else 0,
        inflight=host.inflight,
        queued=sequences.queued if sequences is not None else 0,
        replicas=tuple(replicas),
        requires_sequence=bool(getattr(host.model_class, "requires_sequence", False)),
        loaded_at_startup=host.loaded_at_startup,
    )


def inference_statistics(host: ModelHost) -> InferenceStatistics:
    """Triton's counters of ``host``, over every replica it has now. A plain model's
    predict calls are its executions and compute time (it has no batch queue)."""
    requests = host.counters
    success = Duration(requests.success_count, requests.success_ns)
    fail = Duration(requests.fail_count, requests.fail_ns)
    if not host.batched:
        calls = Duration(success.count + fail.count, success.ns + fail.ns)
        return InferenceStatistics(
            host.name,
            host.version,
            requests.last_inference_ms,
            calls.count,
            calls.count,
            success,
            fail,
            Duration(calls.count, 0),
            calls,
            (BatchStatistics(1, calls),) if calls.count else (),
        )
    queue_count = queue_ns = steps = items = compute_ns = 0
    by_size: dict[int, list[int]] = {}
    for counters in [*(b.counters for b in host.batchers), *host.retired]:
        queue_count += counters.queue_count
        queue_ns += counters.queue_ns
        steps += counters.steps
        items += counters.items_stepped
        for size, (count, ns) in counters.by_batch_size.items():
            entry = by_size.setdefault(size, [0, 0])
            entry[0] += count
            entry[1] += ns
            compute_ns += ns
    return InferenceStatistics(
        name=host.name,
        version=host.version,
        last_inference=requests.last_inference_ms,
        inference_count=items,
        execution_count=steps,
        success=success,
        fail=fail,
        queue=Duration(queue_count, queue_ns),
        compute_infer=Duration(steps, compute_ns),
        batches=tuple(BatchStatistics(size, Duration(c, ns)) for size, (c, ns) in sorted(by_size.items())),
    )


def model_statistics(host: ModelHost) -> ModelStatistics:
    """``host``'s counters summed over the replicas; ``running`` of a plain model counts the
    requests inside ``predict`` / ``predict_stream``."""
    waiting = running = steps = stepped = 0
    for batcher in host.batchers:
        stats = batcher.statistics()
        waiting += stats.waiting
        running += stats.running
        steps += stats.steps
        stepped += stats.items_stepped
    if isinstance(host.runner, PlainRunner):
        running = host.runner.running
    sequences = host.supervisor.statistics() if host.supervisor is not None else None
    return ModelStatistics(
        name=host.name,
        version=host.version,
        inflight=host.inflight,
        waiting=waiting,
        running=running,
        steps=steps,
        items_stepped=stepped,
        open_sequences=sequences.open_sequences if sequences else 0,
        sequences_started=sequences.started if sequences else 0,
        sequences_ended=sequences.ended if sequences else {},
        queued=sequences.queued if sequences else 0,
    )
