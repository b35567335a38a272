"""ModelHost: one loaded model version — its lifecycle, and its requests' way in.

A :class:`BatchModel` gets ``workers`` replicas (its :class:`~.pool.ReplicaPool`), each
stepped by its own :class:`ContinuousBatcher` (requests go through
:class:`BatchedRunner`); a sequence is pinned to one replica for its whole life and a
request without a sequence goes to the least-loaded replica. A plain :class:`Model` runs in the caller's task
(:class:`PlainRunner`; its sequences still run in order through a
:class:`SequenceActor`). The host parses each request's sequence controls once, answers
``sequence_cancel`` itself, and counts the requests in flight."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import trio

from ..api import EndReason, ModelState, OneByOne, RequestControl, ResponseIterator, control_of
from ..declarations import text_generation_of
from ..errors import BadInput, ModelNotReady, Overloaded, ShuttingDown
from ..metrics import ModelMetrics
from ..model import BatchModel, Model
from ..settings import ModelSettings
from ..tracing import engine_span
from ..types import InferenceRequest, InferenceResponse
from ..warmup import failed_warmup, warmup_requests
from .batched import BatchedRunner
from .batcher import ContinuousBatcher
from .counters import RequestCounters, StepCounters
from .inflight import Inflight
from .plain import PlainRunner
from .pool import ReplicaPool
from .replies import cancelled_response
from .supervisor import Supervisor


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
        self.model_class = model_class  # resolved by the engine's repository
        self.batched = issubclass(self.model_class, BatchModel)
        self.pool = ReplicaPool(settings, model_class, lambda: self.ready, metrics)
        self.state = ModelState.LOADING
        self._requests = Inflight(inflight)
        self._leftovers = Inflight(inflight)
        self._runner: PlainRunner | BatchedRunner | None = None
        self._scope = trio.CancelScope()
        self.counters = RequestCounters()
        #: why the model is not READY (set by whoever stops it), else ""
        self.reason = ""
        #: loaded by the engine's start, not by a load request (set by the engine)
        self.loaded_at_startup = False

    @property
    def settings(self) -> ModelSettings:
        """This version's settings (``workers`` follows :meth:`set_workers`)."""
        return self.pool.settings

    @property
    def replicas(self) -> list[Model]:
        return self.pool.replicas

    @property
    def batchers(self) -> list[ContinuousBatcher]:
        return self.pool.batchers

    @property
    def supervisor(self) -> Supervisor | None:
        return self.pool.supervisor

    @property
    def retired(self) -> list[StepCounters]:
        """The step counters of replicas removed at run time (statistics keep them)."""
        return self.pool.retired

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
                    await self.pool.start(nursery)
                    supervisor = self.pool.supervisor = Supervisor(
                        self.replicas[0],
                        self.settings.sequence,
                        self.pool.replica_for_sequence,
                        name=f"model {self.name!r} version {self.version!r}",
                        metrics=self.metrics,
                    )
                    await nursery.start(supervisor.run)
                    self._runner = self._make_runner(nursery, supervisor)
                    await self._warm_up(self._runner)
                    self.state = ModelState.READY
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self.state = ModelState.UNAVAILABLE
            if isinstance(self._runner, BatchedRunner):
                self._runner.closed = True
            await self.pool.unload()

    async def _warm_up(self, runner: PlainRunner | BatchedRunner) -> None:
        """Serve the settings' ``warmup`` requests (still LOADING: the health routes
        say not ready), in order, one entry after another: each sent ``workers`` times at
        once, so the least-loaded routing gives every replica one (an entry of a sequence
        once: its sequence lives on one replica). The first failure fails the load
        (:class:`~actorserve.warmup.WarmupFailed` naming the entry)."""
        settings = self.settings
        if not settings.warmup:
            return
        spec = text_generation_of(settings, self.model_class)
        text_input = None if spec is None else spec.input
        rounds = [
            warmup_requests(settings.warmup, self.name, self.version, text_input)
            for _ in range(settings.workers)
        ]
        for i in range(len(settings.warmup)):
            copies = [requests[i] for requests in rounds]
            if control_of(copies[0]).stateful:
                copies = copies[:1]

            async def serve(request: InferenceRequest, i: int = i) -> None:
                try:
                    await runner.infer(request, control_of(request))
                except Exception as exc:
                    raise failed_warmup(i, exc) from exc

            async with trio.open_nursery() as nursery:
                for request in copies:
                    nursery.start_soon(serve, request)

    async def set_workers(self, workers: int, grace: float) -> None:
        """Scale to ``workers`` replicas at run time (one change at a time).

        Up: new replicas load and take new requests and new sequences. Down: the last
        replicas take nothing new; their in-flight requests get ``grace`` seconds, then
        are cancelled; sequences pinned to them end with reason ``shutdown`` (a running
        request of theirs may finish within the grace period, their next one is told the
        sequence was shut down). :class:`BadInput` for fewer than 1."""
        if workers < 1:
            raise BadInput(f"workers must be >= 1, got {workers}")
        async with self.pool.scaling:
            if self.state is not ModelState.READY:
                raise ModelNotReady(f"model {self.name!r} version {self.version!r} is {self.state.lower()}")
            await self.pool.resize(workers, grace, self._runner)

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

    # -- admission ---------------------------------------------------------------------

    def _enter(self) -> PlainRunner | BatchedRunner:
        if self.state is not ModelState.READY:
            if self.state is ModelState.LOADING:
                raise ModelNotReady(f"model {self.name!r} version {self.version!r} is still loading")
            raise ShuttingDown(f"model {self.name!r} version {self.version!r} is shutting down")
        assert self._runner is not None
        self.pool.recycle_worn()
        self._requests.enter()
        return self._runner

    def _refused(self, exc: Overloaded) -> None:
        if self.metrics is not None:
            self.metrics.reject(exc.bound)

    def _cancel(self, request: InferenceRequest, control: RequestControl) -> InferenceResponse:
        assert self.supervisor is not None
        sequence_id = self.supervisor.cancel(control.sequence_id, control.owner)
        return cancelled_response(self.name, self.version, request, sequence_id)

    # -- the public operations ----------------------------------------------------------

    @asynccontextmanager
    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[ResponseIterator]:
        """Responses for one request, as they are produced. Leaving the block (or being
        cancelled) cancels the request; its sequence, if any, stays open."""
        runner = self._enter()
        started, ok, span = self.counters.started(), False, None
        try:
            control = control_of(request).checked(self.settings.sequence.max_id_length)
            if control.trace is not None:
                span = engine_span(request, control.trace, self.name, self.version)
                control = control_of(request)  # now naming the engine's span
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
            if span is not None:
                span.end(ok)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """One response for one request (a stream's responses merged)."""
        runner = self._enter()
        started, ok, span = self.counters.started(), False, None
        try:
            control = control_of(request).checked(self.settings.sequence.max_id_length)
            if control.trace is not None:
                span = engine_span(request, control.trace, self.name, self.version)
                control = control_of(request)  # now naming the engine's span
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
            if span is not None:
                span.end(ok)

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
