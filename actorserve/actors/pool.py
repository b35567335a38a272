"""ReplicaPool: the replicas of one model version, and how their number changes.

A :class:`BatchModel`'s replicas each get a :class:`ContinuousBatcher`, started in the
host's nursery; a plain :class:`Model`'s replicas are called by its
:class:`PlainRunner`. The pool loads and unloads them, scales them at run time
(:meth:`ReplicaPool.resize`), replaces a replica whose step hung, recycles one worn out
by ``max_requests_per_replica``, and picks the replica a new sequence is pinned to.
Its :class:`~.host.ModelHost` owns the lifecycle and the requests; the pool asks it
only whether the model is still serving."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from ..api import EndReason
from ..errors import ModelFailed
from ..metrics import ModelMetrics
from ..model import BatchModel, Model
from ..settings import ModelSettings
from .batched import BatchedRunner, least_loaded
from .batcher import ContinuousBatcher
from .counters import StepCounters
from .plain import PlainRunner
from .steploop import ReplicaHung
from .supervisor import Supervisor

log = logging.getLogger(__name__)

#: seconds every replica's ``unload`` gets, together, when a model version stops
UNLOAD_TIMEOUT = 10.0

#: seconds between looks at a retiring replica's load (bounded by the grace period)
RETIRE_POLL = 0.01


class ReplicaPool:
    """The replicas of one model version. :meth:`start` gives it the host's nursery
    (its batchers run there); the host sets :attr:`supervisor` once it has one.

    ``serving`` says whether the host still serves (a hung or worn replica is replaced
    only then). ``metrics``: where batchers and replacements are recorded. Changes to
    the number of replicas take :attr:`scaling`, one at a time."""

    def __init__(
        self,
        settings: ModelSettings,
        model_class: type[Model],
        serving: Callable[[], bool],
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.model_class = model_class
        self.metrics = metrics
        self.replicas: list[Model] = []
        self.batchers: list[ContinuousBatcher] = []
        self.supervisor: Supervisor | None = None
        #: the step counters of replicas removed at run time (statistics keep them)
        self.retired: list[StepCounters] = []
        self.scaling = trio.Lock()
        self._serving = serving
        self._nursery: trio.Nursery | None = None
        self._batcher_scopes: dict[ContinuousBatcher, trio.CancelScope] = {}
        self._recycling: set[ContinuousBatcher] = set()  # worn out (max_requests_per_replica)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str:
        return self.settings.version

    async def start(self, nursery: trio.Nursery) -> None:
        """Load ``workers`` replicas, their batchers running in ``nursery``."""
        self._nursery = nursery
        for _ in range(self.settings.workers):
            await self._add_replica()

    async def unload(self) -> None:
        """Unload every replica (their batchers have stopped stepping them), within
        :data:`UNLOAD_TIMEOUT` and shielded: the host is stopping."""
        with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT):
            for model in self.replicas:
                try:
                    await model.unload()
                except Exception:
                    log.exception("model %r: unload raised", self.name)

    async def _add_replica(self) -> None:
        """Load one more replica (and start its batcher) in the host's nursery."""
        assert self._nursery is not None
        model = self.model_class(self.settings)
        await model.load()
        if isinstance(model, BatchModel):
            batcher = ContinuousBatcher(
                model,
                max_batch_size=model.max_batch_size,
                max_batch_time=self.settings.max_batch_time,
                max_pending=self.settings.max_pending,
                name=f"{self.name}:{self.version} replica {len(self.replicas)}",
            )
            batcher.counters.metrics = self.metrics  # its steps and waits also go to Prometheus
            scope = self._batcher_scopes[batcher] = trio.CancelScope()
            await self._nursery.start(self._run_batcher, batcher, scope)
            self.batchers.append(batcher)
        self.replicas.append(model)

    async def _run_batcher(
        self, batcher: ContinuousBatcher, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            with scope:
                await batcher.run(task_status=task_status)
        except ReplicaHung:  # its items failed with it
            await self._replace_hung(batcher)
        finally:
            self._batcher_scopes.pop(batcher, None)
            if batcher.model not in self.replicas and not batcher.hung:  # retired by scaling down
                with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT):
                    try:
                        await batcher.model.unload()
                    except Exception:
                        log.exception("model %r: unload raised", self.name)

    async def _replace_hung(self, batcher: ContinuousBatcher) -> None:
        """Take out a replica whose step hung (its items failed), end its sequences
        (``failed``) and load another in its place. The hung one is not unloaded: its
        abandoned thread may still be inside its step."""
        self.retired.append(batcher.counters)
        batcher.counters.replaced("hung")  # counted as taken out (its successor may fail to load: logged)
        if batcher in self.batchers:
            del self.replicas[self.batchers.index(batcher)]
            self.batchers.remove(batcher)
        if self.supervisor is not None:
            self.supervisor.end_pinned(batcher, EndReason.FAILED, graceful=False)
        async with self.scaling:
            if self._serving():
                log.warning("model %r: loading a replica in place of the hung one", self.name)
                try:
                    await self._add_replica()
                except Exception:
                    log.exception("model %r: loading a replica in place of a hung one failed", self.name)

    async def resize(self, workers: int, grace: float, runner: PlainRunner | BatchedRunner | None) -> None:
        """Scale to ``workers`` replicas (the caller holds :attr:`scaling` and has checked
        the model serves); see :meth:`.host.ModelHost.set_workers`."""
        while len(self.replicas) < workers:
            try:
                await self._add_replica()
            except Exception as exc:  # the model's own load failed: say so, keep serving
                raise ModelFailed.wrap(self.name, exc, "to load a new replica") from None
        if isinstance(runner, PlainRunner):
            runner.resize(workers)
            await self._retire_plain(runner, workers, grace)
        else:
            while len(self.batchers) > workers:
                await self._retire_batcher(grace)
        self.settings = attrs.evolve(self.settings, workers=workers)

    def recycle_worn(self) -> None:
        """Start replacing each replica that has admitted ``max_requests_per_replica``."""
        for batcher in self.batchers if self.settings.max_requests_per_replica else ():
            if (
                batcher.counters.queue_count >= self.settings.max_requests_per_replica
                and batcher not in self._recycling
            ):
                self._recycling.add(batcher)
                self._nursery.start_soon(self._recycle, batcher)  # type: ignore[union-attr]

    async def _recycle(self, batcher: ContinuousBatcher) -> None:
        """``batcher`` admitted ``max_requests_per_replica``: load a fresh replica for new
        work; the worn one finishes what it holds and the sequences pinned to it (they
        end as they would), then stops and is unloaded, freeing what its model kept."""
        async with self.scaling:
            if not self._serving() or batcher not in self.batchers:
                return
            try:
                await self._add_replica()
            except Exception:
                log.exception("model %r: loading a fresh replica failed; the worn one serves on", self.name)
                return
            del self.replicas[self.batchers.index(batcher)]
            self.batchers.remove(batcher)
        batcher.counters.replaced("recycled")
        log.info(
            "model %r: %s recycled after %d requests (max_requests_per_replica)",
            self.name,
            batcher.name,
            batcher.counters.queue_count,
        )
        assert self.supervisor is not None
        while batcher.load or self.supervisor.pinned_count(batcher):  # noqa: ASYNC110 (as below)
            await trio.sleep(RETIRE_POLL)
        self.retired.append(batcher.counters)
        scope = self._batcher_scopes.get(batcher)
        if scope is not None:
            scope.cancel()  # its task unloads it (no longer a replica)
        self._recycling.discard(batcher)

    async def _retire_batcher(self, grace: float) -> None:
        assert self.supervisor is not None
        batcher = self.batchers.pop()  # routes nothing new to it from now on
        self.replicas.pop()
        self.supervisor.end_pinned(batcher, EndReason.SHUTDOWN, graceful=True)
        with trio.move_on_after(grace):
            # A look at a count that many paths change (no event to wait on), bounded by
            # the grace period; scaling is rare.
            while batcher.load:  # noqa: ASYNC110
                await trio.sleep(RETIRE_POLL)
        self.supervisor.end_pinned(batcher, EndReason.SHUTDOWN, graceful=False)
        self.retired.append(batcher.counters)
        scope = self._batcher_scopes.get(batcher)
        if scope is not None:
            scope.cancel()  # the batcher fails what it still holds (ShuttingDown)

    async def _retire_plain(self, runner: PlainRunner, workers: int, grace: float) -> None:
        with trio.move_on_after(grace):
            while runner.trim() > workers:  # noqa: ASYNC110 (as above)
                await trio.sleep(RETIRE_POLL)
        # a replica still busy after the grace period is dropped once its calls return
        del self.replicas[max(runner.trim(), workers) :]

    def replica_for_sequence(self) -> ContinuousBatcher | None:
        """The replica serving the fewest open sequences (then the least loaded): a
        sequence stays on its replica for its whole life, so spread them."""
        supervisor = self.supervisor
        if not self.batchers or supervisor is None:
            return least_loaded(self.batchers) if self.batchers else None
        return min(self.batchers, key=lambda b: (supervisor.pinned_count(b), b.load))
