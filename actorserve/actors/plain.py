"""The plain-model runner: a :class:`Model`'s ``predict`` / ``predict_stream`` run in
the caller's own task.

Each replica runs at most ``max_pending`` requests at once (a request goes to the
least busy replica; past the bound, :class:`Overloaded`). A request of a stateful
sequence first waits for its turn from the sequence's :class:`SequenceActor` (so the
requests of one sequence run one after another), then runs here as well.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing, asynccontextmanager
from typing import TypeVar

import trio

from ..api import OneByOne, RequestControl, ResponseIterator
from ..errors import ActorServeError, ModelFailed, Overloaded, SequenceNotFound
from ..model import Model
from ..settings import ModelSettings
from ..types import InferenceRequest, InferenceResponse
from .batcher import WorkItem
from .outputs import malformed, response_problem
from .pumped import Pumped
from .replies import new_item, stamp
from .sequence import Job
from .supervisor import Supervisor

log = logging.getLogger(__name__)

#: how late, as a fraction of ``step_timeout``, a plain model's stream may notice a step
#: past it (see ``PlainRunner._stream_into``); never early
DEADLINE_SLACK = 0.01
T = TypeVar("T")


async def _one(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


class PlainRunner:
    """Runs requests on the replicas of a plain model. Made by the :class:`ModelHost`
    once the replicas are loaded; the host counts requests in flight, this counts what
    each replica runs. Model exceptions become :class:`ModelFailed` (logged)."""

    def __init__(self, settings: ModelSettings, replicas: list[Model], supervisor: Supervisor) -> None:
        self.settings = settings
        self.replicas = replicas
        self.supervisor = supervisor
        #: requests running per replica (bounded by ``settings.max_pending``)
        self._load = [0] * len(replicas)
        #: replicas given new requests: the first ``active`` (the others are retiring)
        self.active = len(replicas)

    @property
    def running(self) -> int:
        """Requests running in the model now, over every replica."""
        return sum(self._load)

    def load_of(self, index: int) -> int:
        return self._load[index] if index < len(self._load) else 0

    def resize(self, active: int) -> None:
        """Give new requests to the first ``active`` replicas (``replicas`` holds them)."""
        self.active = active
        self._load.extend([0] * (len(self.replicas) - len(self._load)))

    def trim(self) -> int:
        """Forget retired replicas that run nothing any more (from the end); return how
        many replicas are left (the caller shortens ``replicas`` to that)."""
        while len(self._load) > self.active and self._load[-1] == 0:
            self._load.pop()
        return len(self._load)

    def _take_replica(self) -> int:
        index = min(range(self.active), key=self._load.__getitem__)
        if self._load[index] >= self.settings.max_pending:
            raise Overloaded(
                f"model {self.settings.name!r}: {self.settings.max_pending} requests already running (max_pending)",
                bound="max_pending",
            )
        self._load[index] += 1
        return index

    async def _call(
        self, model: Model, response: Awaitable[InferenceResponse], *, timed: bool = True
    ) -> InferenceResponse:
        """A response of ``model``'s code, checked (within ``step_timeout`` if
        ``timed``); its exceptions become :class:`ModelFailed` (logged)."""
        try:
            result = await (self._timed(model, response) if timed else response)
        except (ActorServeError, StopAsyncIteration):
            raise
        except Exception as exc:
            raise ModelFailed.wrap(self.settings.name, exc) from None
        problem = response_problem(result)
        if problem is not None:
            raise malformed(self.settings.name, problem)
        return result

    async def _timed(self, model: Model, call: Awaitable[T]) -> T:
        """``call`` within the model's ``step_timeout``: cancelled past it (a call that
        does not yield to the event loop cannot be, and is only logged)."""
        timeout = model.step_timeout
        if timeout is None:
            return await call
        started = trio.current_time()
        try:
            with trio.fail_after(timeout):
                result = await call
        except trio.TooSlowError:
            raise self._timed_out(timeout) from None
        if trio.current_time() - started > timeout:
            self._overran(trio.current_time() - started, timeout)
        return result

    def _timed_out(self, timeout: float) -> ModelFailed:
        error = ModelFailed(
            f"model {self.settings.name!r}: no response within its step_timeout of {timeout:g} s"
        )
        log.error("%s (the call was cancelled)", error)
        return error

    def _overran(self, took: float, timeout: float) -> None:
        log.warning(
            "model %r: a call took %.1f s, past its step_timeout of %g s, without letting the event loop "
            "cancel it (work computed inline cannot be preempted: run long work in a thread)",
            self.settings.name,
            took,
            timeout,
        )

    # -- the operations (the host has parsed the sequence controls; cancel is its own) --

    async def infer(self, request: InferenceRequest, control: RequestControl) -> InferenceResponse:
        """One response for one request."""
        if control.stateful:
            return await self._infer_in_turn(request, control)
        index = self._take_replica()
        try:
            model = self.replicas[index]
            return stamp(await self._call(model, model.predict(request)), request.id)
        finally:
            self._load[index] -= 1

    @asynccontextmanager
    async def infer_stream(
        self, request: InferenceRequest, control: RequestControl
    ) -> AsyncIterator[ResponseIterator]:
        """The responses of one request, produced by a task of their own (the stream's
        actor) into a buffer of ``reply_buffer`` responses that the caller reads in
        batches (:mod:`.pumped`). Leaving the block cancels that task."""
        out = Pumped(self.settings.reply_buffer)
        error: BaseException | None = None
        with Pumped.producing():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._produce, out, request, control)
                try:
                    yield out
                except BaseException as exc:
                    error = exc  # raised as itself below, not inside the nursery's group
                finally:
                    nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    @asynccontextmanager
    async def stream_input(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[ResponseIterator]:
        """A ``stream_input`` model's ``predict_stream`` over the whole request stream."""
        index = self._take_replica()
        try:
            model = self.replicas[index]
            async with aclosing(model.predict_stream(requests)) as out:  # type: ignore[type-var]
                async with aclosing(self._checked(model, out)) as checked:
                    yield OneByOne(checked)
        finally:
            self._load[index] -= 1

    async def _checked(
        self, model: Model, responses: AsyncIterator[InferenceResponse]
    ) -> AsyncGenerator[InferenceResponse, None]:
        """A stream-in model's responses, checked. No deadline: such a model may wait
        for the client's next request as long as the client takes."""
        while True:
            try:
                response = await self._call(model, responses.__anext__(), timed=False)
            except StopAsyncIteration:
                return
            yield response

    # -- one request --------------------------------------------------------------------

    async def _wait_turn(self, request: InferenceRequest, control: RequestControl) -> WorkItem:
        """Queue ``request`` in its sequence and wait until the actor lets it run. The
        returned item is finished by the caller when the request is done."""
        item = new_item(request, self.settings.reply_buffer)
        job = Job(item, turn=trio.Event())
        actor = await self.supervisor.submit(job, control)
        item.sequence_id, item.model_sequence_id = actor.id, actor.model_id
        assert job.turn is not None
        try:
            await job.turn.wait()
        except BaseException:
            item.cancel()
            raise
        if item.finished:  # the sequence ended while this request waited: say why
            raise item.error or SequenceNotFound(f"sequence {actor.id!r} ended")
        return item

    async def _produce(self, out: Pumped, request: InferenceRequest, control: RequestControl) -> None:
        """Run ``request``'s stream into ``out``: its responses, then its end or error."""
        try:
            item = await self._wait_turn(request, control) if control.stateful else None
            try:
                index = self._take_replica()
            except BaseException:
                if item is not None:
                    item.finish()
                raise
            try:
                await self._stream_into(out, self.replicas[index], request, item)
            except ModelFailed as exc:
                if item is not None:
                    item.fail(exc)  # the sequence ends (failed): its state is suspect
                raise
            finally:
                self._load[index] -= 1
                if item is not None:
                    item.finish()
        except Exception as exc:
            out.fail(exc)
        else:
            out.close()

    async def _stream_into(
        self, out: Pumped, model: Model, request: InferenceRequest, item: WorkItem | None
    ) -> None:
        """Pull the model's responses into ``out``, each step within ``step_timeout``:
        one cancel scope for the whole stream whose deadline moves with the steps (a
        scope per step cost more than the rest of a cheap model's step). The deadline
        moves only when it would otherwise come early, to :data:`DEADLINE_SLACK` past
        the step's own: steps that follow each other quickly share one."""
        timeout = model.step_timeout
        slack = 0.0 if timeout is None else timeout * DEADLINE_SLACK
        sequence_id = item.sequence_id if item is not None else None
        model_id = item.model_sequence_id if item is not None else None
        name = self.settings.name
        current_time = trio.current_time
        async with aclosing(model.predict_stream(_one(request))) as responses:  # type: ignore[type-var]
            next_response = responses.__anext__
            with trio.CancelScope() as steps:
                armed = -math.inf  # the scope's deadline, when set
                while True:
                    started = current_time()
                    if timeout is not None and started + timeout > armed:
                        armed = steps.deadline = started + timeout + slack
                    try:
                        response = await next_response()
                    except StopAsyncIteration:
                        break
                    except ActorServeError:
                        raise
                    except Exception as exc:
                        raise ModelFailed.wrap(name, exc) from None
                    now = current_time()
                    if timeout is not None and now - started > timeout:
                        self._overran(now - started, timeout)
                    problem = response_problem(response)
                    if problem is not None:
                        raise malformed(name, problem)
                    if item is not None and item.cancelled:
                        raise SequenceNotFound(f"sequence {sequence_id!r} was cancelled")
                    out.put(stamp(response, request.id, sequence_id, model_id), now)
                    if out.due(now):
                        if armed != -math.inf:  # the reader's pace is not the model's
                            steps.deadline, armed = math.inf, -math.inf
                        await out.turn()
            if steps.cancelled_caught:
                assert timeout is not None  # only the step deadline cancels this scope
                raise self._timed_out(timeout)

    async def _infer_in_turn(self, request: InferenceRequest, control: RequestControl) -> InferenceResponse:
        """A sequence's unary request: its turn in the sequence, then ``predict``."""
        item = await self._wait_turn(request, control)
        try:
            index = self._take_replica()
        except BaseException:
            item.finish()
            raise
        model = self.replicas[index]
        try:
            response = await self._call(model, model.predict(request))
            return stamp(response, request.id, item.sequence_id, item.model_sequence_id)
        except ModelFailed as exc:
            item.fail(exc)  # the sequence ends (failed): its state is suspect
            raise
        finally:
            self._load[index] -= 1
            item.finish()
