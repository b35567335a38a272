"""Records of the management API (part of :mod:`actorserve.api`, which re-exports them):
what a model version looks like to an operator (:class:`ModelDescription`) and Triton's
inference statistics (:class:`InferenceStatistics`). Plain frozen values, so they cross
the process boundary like the other records."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class ReplicaDescription:
    """One worker (replica) of a model version."""

    index: int
    #: requests waiting for a batch slot (a BatchModel)
    waiting: int = 0
    #: requests in the running batch, or inside predict for a plain model
    running: int = 0
    #: open sequences pinned to this replica
    sequences: int = 0


@attrs.frozen(slots=True)
class ModelDescription:
    """A loaded model version as the management API describes it."""

    name: str
    version: str
    state: str
    reason: str = ""
    default_version: str = ""
    versions: tuple[str, ...] = ()
    implementation: str = ""
    platform: str = ""
    batched: bool = False
    workers: int = 1
    max_batch_size: int = 0
    max_batch_time: float = 0.0
    max_pending: int = 0
    idle_timeout_ms: int = 0
    max_duration_ms: int = 0
    max_queue: int = 0
    max_sequences: int = 0
    evict_idle: bool = False
    open_sequences: int = 0
    #: requests accepted and not yet answered
    inflight: int = 0
    #: requests waiting in open sequences' mailboxes behind a running one
    queued: int = 0
    replicas: tuple[ReplicaDescription, ...] = ()
    #: every request must belong to a sequence (the model keeps per-sequence state)
    requires_sequence: bool = False
    #: loaded as the server started (its settings or model store), not by a load request
    loaded_at_startup: bool = False


@attrs.frozen(slots=True)
class Duration:
    """Triton's ``StatisticDuration``: how many, and their total nanoseconds."""

    count: int = 0
    ns: int = 0


@attrs.frozen(slots=True)
class BatchStatistics:
    """The steps of one batch size (Triton's ``InferBatchStatistics.compute_infer``)."""

    batch_size: int
    compute_infer: Duration = Duration()


@attrs.frozen(slots=True)
class InferenceStatistics:
    """Triton's ``ModelStatistics`` of one model version, summed over its replicas.

    ``success``/``fail``: requests and their durations (accepted to answered);
    ``queue``: time items of a BatchModel waited for a batch slot; ``compute_infer``:
    the model's work (steps of a BatchModel; predict calls of a plain model)."""

    name: str
    version: str
    #: when the last request arrived, in milliseconds since the epoch (0: never)
    last_inference: int = 0
    #: inferences (an item in a step of n items counts once per step)
    inference_count: int = 0
    #: executions (steps, or predict calls)
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_infer: Duration = Duration()
    batches: tuple[BatchStatistics, ...] = ()
