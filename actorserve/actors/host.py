"""ModelHost: one loaded model version — its lifecycle, its replicas, and routing.

A :class:`BatchModel` gets ``workers`` replicas, each stepped by its own
:class:`ContinuousBatcher` (requests go through :class:`BatchedRunner`); a sequence is
pinned to one replica for its whole life and a request without a sequence goes to the
least-loaded replica. A plain :class:`Model` runs in the caller's task
(:class:`PlainRunner`; its sequences still run in order through a
:class:`SequenceActor`). The host parses each request's sequence controls once, answers
``sequence_cancel`` itself, and counts the requests in flight."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import attrs
import trio

from ..api import EndReason, ModelState, OneByOne, ResponseIterator, SequenceControl
from ..errors import BadInput, ModelFailed, ModelNotReady, Overloaded, ShuttingDown
from ..metrics import ModelMetrics
from ..model import BatchModel, Model
from ..settings import ModelSettings
from ..types import InferenceRequest, InferenceResponse
from .batched import BatchedRunner, least_loaded
from .batcher import ContinuousBatcher
from .counters import RequestCounters, StepCounters
from .inflight import Inflight
from .plain import PlainRunner
from .replies import cancelled_response
from .steploop import ReplicaHung
from .supervisor import Supervisor

log = logging.getLogger(__name__)

#: seconds every replica's ``unload`` gets, together, when a model version stops
UNLOAD_TIMEOUT = 10.0

#: seconds between looks at a retiring replica's load (bounded by the grace period)
RETIRE_POLL = 0.01


async def _single(response: InferenceResponse) -> AsyncIterator[InferenceResponse]:
    yield response


class ModelHost:
    """Serves one model version. Start :meth:`run` with ``nursery.start`` (it loads the
    model and returns when it is ready); stop it with :meth:`stop`.

    ``inflight``, if given, is the engine's counter: this host's requests (and the
    items they left in a batch) count in it too. ``metrics``: where its batchers,
    supervisor, refusals and replica replacements are recorded."""

    def __init__(
        self,
        settings: ModelSettings,
        model_class: type[Model],
        *,
        inflight: Inflight | None = None,
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.settings = settings
        self.model_class = model_class  # resolved by the engine's repository
        self.batched = issubclass(self.model_class, BatchModel)
        self.replicas: list[Model] = []
        self.batchers: list[ContinuousBatcher] = []
        self.supervisor: Supervisor | None = None
        self.state = ModelState.LOADING
        self._requests = Inflight(inflight)
        self._leftovers = Inflight(inflight)
        self._runner: PlainRunner | BatchedRunner | None = None
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._batcher_scopes: dict[ContinuousBatcher, trio.CancelScope] = {}
        self._scaling = trio.Lock()
        self.counters = RequestCounters()
        #: the step counters of replicas removed at run time (statistics keep them)
        self.retired: list[StepCounters] = []
        self._recycling: set[ContinuousBatcher] = set()  # worn out (max_requests_per_replica)
        #: why the model is not READY (set by whoever stops it), else ""
        self.reason = ""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str:
        return self.settings.version

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def inflight(self) -> int:
        """Requests accepted and not yet answered."""
        return self._requests.count

    @property
    def runner(self) -> PlainRunner | BatchedRunner | None:
        return self._runner

    @property
    def model(self) -> Model:
        """The first replica (for metadata)."""
        return self.replicas[0]

    def metadata(self) -> dict[str, Any]:
        """OIP metadata; :class:`ModelNotReady` while the model loads."""
        if not self.replicas:
            raise ModelNotReady(f"model {self.name!r} version {self.version!r} is still loading")
        return self.model.metadata()

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for _ in range(self.settings.workers):
                        await self._add_replica()
                    self.supervisor = Supervisor(
                        self.replicas[0],
                        self.settings.sequence,
                        self._replica_for_sequence,
                        name=f"model {self.name!r} version {self.version!r}",
                        metrics=self.metrics,
                    )
                    await nursery.start(self.supervisor.run)
                    self._runner = self._make_runner(nursery, self.supervisor)
                    self.state = ModelState.READY
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self.state = ModelState.UNAVAILABLE
            if isinstance(self._runner, BatchedRunner):
                self._runner.closed = True
            with trio.CancelScope(shield=True), trio.move_on_after(UNLOAD_TIMEOUT):
                for model in self.replicas:  # their batchers have stopped stepping them
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
        async with self._scaling:
            if self.state is ModelState.READY:
                log.warning("model %r: loading a replica in place of the hung one", self.name)
                try:
                    await self._add_replica()
                except Exception:
                    log.exception("model %r: loading a replica in place of a hung one failed", self.name)

    async def set_workers(self, workers: int, grace: float) -> None:
        """Scale to ``workers`` replicas at run time (one change at a time).

        Up: new replicas load and take new requests and new sequences. Down: the last
        replicas take nothing new; their in-flight requests get ``grace`` seconds, then
        are cancelled; sequences pinned to them end with reason ``shutdown`` (a running
        request of theirs may finish within the grace period, their next one is told the
        sequence was shut down). :class:`BadInput` for fewer than 1."""
        if workers < 1:
            raise BadInput(f"workers must be >= 1, got {workers}")
        async with self._scaling:
            if self.state is not ModelState.READY:
                raise ModelNotReady(f"model {self.name!r} version {self.version!r} is {self.state.lower()}")
            while len(self.replicas) < workers:
                try:
                    await self._add_replica()
                except Exception as exc:  # the model's own load failed: say so, keep serving
                    raise ModelFailed.wrap(self.name, exc, "to load a new replica") from None
            if isinstance(self._runner, PlainRunner):
                self._runner.resize(workers)
                await self._retire_plain(workers, grace)
            else:
                while len(self.batchers) > workers:
                    await self._retire_batcher(grace)
            self.settings = attrs.evolve(self.settings, workers=workers)

    async def _recycle(self, batcher: ContinuousBatcher) -> None:
        """``batcher`` admitted ``max_requests_per_replica``: load a fresh replica for new
        work; the worn one finishes what it holds and the sequences pinned to it (they
        end as they would), then stops and is unloaded, freeing what its model kept."""
        async with self._scaling:
            if self.state is not ModelState.READY or batcher not in self.batchers:
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

    async def _retire_plain(self, workers: int, grace: float) -> None:
        runner = self._runner
        assert isinstance(runner, PlainRunner)
        with trio.move_on_after(grace):
            while runner.trim() > workers:  # noqa: ASYNC110 (as above)
                await trio.sleep(RETIRE_POLL)
        # a replica still busy after the grace period is dropped once its calls return
        del self.replicas[max(runner.trim(), workers) :]

    def _make_runner(self, nursery: trio.Nursery, supervisor: Supervisor) -> PlainRunner | BatchedRunner:
        model = self.replicas[0]
        if isinstance(model, BatchModel):
            return BatchedRunner(self.settings, model, self.batchers, supervisor, nursery, self._leftovers)
        return PlainRunner(self.settings, self.replicas, supervisor)

    def stop(self) -> None:
        """End every sequence (reason ``shutdown``) and stop at once."""
        self.state = ModelState.UNAVAILABLE
        if self.supervisor is not None:
            self.supervisor.end_all(EndReason.SHUTDOWN)
        self._scope.cancel()

    async def drain(self, grace: float) -> None:
        """Refuse new requests and wait up to ``grace`` seconds for in-flight ones."""
        if self.state is ModelState.READY:
            self.state = ModelState.UNLOADING
        if isinstance(self._runner, PlainRunner):
            self._runner.trim()
        with trio.move_on_after(grace):
            await self._requests.wait_idle()

    # -- routing -----------------------------------------------------------------------

    def _replica_for_sequence(self) -> ContinuousBatcher | None:
        """The replica serving the fewest open sequences (then the least loaded): a
        sequence stays on its replica for its whole life, so spread them."""
        supervisor = self.supervisor
        if not self.batchers or supervisor is None:
            return least_loaded(self.batchers) if self.batchers else None
        return min(self.batchers, key=lambda b: (supervisor.pinned_count(b), b.load))

    def _enter(self) -> PlainRunner | BatchedRunner:
        if self.state is not ModelState.READY:
            if self.state is ModelState.LOADING:
                raise ModelNotReady(f"model {self.name!r} version {self.version!r} is still loading")
            raise ShuttingDown(f"model {self.name!r} version {self.version!r} is shutting down")
        assert self._runner is not None
        for batcher in self.batchers if self.settings.max_requests_per_replica else ():
            if (
                batcher.counters.queue_count >= self.settings.max_requests_per_replica
                and batcher not in self._recycling
            ):
                self._recycling.add(batcher)
                self._nursery.start_soon(self._recycle, batcher)  # type: ignore[union-attr]
        self._requests.enter()
        return self._runner

    def _refused(self, exc: Overloaded) -> None:
        if self.metrics is not None:
            self.metrics.reject(exc.bound)

    def _cancel(self, request: InferenceRequest, control: SequenceControl) -> InferenceResponse:
        assert self.supervisor is not None
        sequence_id = self.supervisor.cancel(control.id, control.owner)
        return cancelled_response(self.name, self.version, request, sequence_id)

    # -- the public operations ----------------------------------------------------------

    @asynccontextmanager
    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[ResponseIterator]:
        """Responses for one request, as they are produced. Leaving the block (or being
        cancelled) cancels the request; its sequence, if any, stays open."""
        runner = self._enter()
        started, ok = self.counters.started(), False
        try:
            control = SequenceControl.take(request.parameters, self.settings.sequence.max_id_length)
            if control.cancel:
                yield OneByOne(_single(self._cancel(request, control)))
            else:
                async with runner.infer_stream(request, control) as responses:
                    yield responses
            ok = True
        except Overloaded as exc:
            self._refused(exc)
            raise
        finally:
            self.counters.ended(started, ok)
            self._requests.leave()

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """One response for one request (a stream's responses merged)."""
        runner = self._enter()
        started, ok = self.counters.started(), False
        try:
            control = SequenceControl.take(request.parameters, self.settings.sequence.max_id_length)
            if control.cancel:
                response = self._cancel(request, control)
            else:
                response = await runner.infer(request, control)
            ok = True
            return response
        except Overloaded as exc:
            self._refused(exc)
            raise
        finally:
            self.counters.ended(started, ok)
            self._requests.leave()

    @asynccontextmanager
    async def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[ResponseIterator]:
        """MLServer's streaming: a stream of requests in, one stream of responses out.

        A model with ``stream_input`` gets the whole request stream in one
        ``predict_stream`` call; otherwise each request is served in turn."""
        runner = self._enter()
        try:
            if isinstance(runner, PlainRunner) and self.model_class.stream_input:
                async with runner.stream_input(requests) as responses:
                    yield responses
            else:
                async with aclosing(self._each(requests)) as out:
                    yield OneByOne(out)
        finally:
            self._requests.leave()

    async def _each(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncGenerator[InferenceResponse, None]:
        async for request in requests:
            async with self.infer_stream(request) as responses:
                async for response in responses:
                    yield response
