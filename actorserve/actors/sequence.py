"""The sequence actor: one trio task per open stateful sequence.

It owns the sequence's state and a bounded mailbox of requests, and runs those
requests strictly one after another. It ends, always through the same ``finally``,
when the sequence is ended by a request, cancelled, idle too long, open too long,
evicted, failed or shut down; the model's ``on_sequence_end`` is called exactly once
with that reason, after any request still in a batch has left it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Protocol

import attrs
import trio

from ..api import EndReason
from ..errors import ActorServeError, ModelFailed, SequenceNotFound
from ..model import BatchModel, Model
from .batcher import ContinuousBatcher, WorkItem
from .mailbox import Mailbox

log = logging.getLogger(__name__)

#: How long an ending actor waits for its running request to leave the batch before it
#: calls on_sequence_end anyway. A step is normally milliseconds; this only bounds a hang.
LEAVE_BATCH_TIMEOUT = 30.0


@attrs.define(eq=False, slots=True)
class Job:
    """A request queued for a sequence. ``end``: the sequence ends after it.
    ``turn`` is set when a plain (non-batch) model's caller may run it."""

    item: WorkItem
    end: bool = False
    turn: trio.Event | None = None


class ActorSupervisor(Protocol):
    """What an actor needs from whoever started it (the :class:`Supervisor`)."""

    def became_idle(self, actor: SequenceActor) -> None:
        """The actor finished a request and waits for the next: watch its idle time."""

    def forget(self, actor: SequenceActor, reason: EndReason) -> None:
        """The actor is ending with ``reason`` (called exactly once)."""


def ended(sequence_id: str, reason: EndReason, detail: str | None = None) -> SequenceNotFound:
    """The error a request of an ended sequence gets: ``sequence 's' expired``. A
    ``detail`` (why a model evicted it) replaces the phrase's own parenthesis:
    ``sequence 's' was evicted (kv_cache_budget_mb of model 'm' reached)``."""
    phrase = reason.phrase if detail is None else f"{reason.phrase.partition(' (')[0]} ({detail})"
    return SequenceNotFound(f"sequence {sequence_id!r} {phrase}")


class SequenceActor:
    """Started by the :class:`Supervisor` with ``nursery.start(actor.run)``; talk to it
    only through :meth:`deliver` (queue a job) and :meth:`stop` (end it with a reason).

    Kept small (100,000 idle sequences are a normal load): no cancel scope of its own —
    the supervisor's reaper calls :meth:`stop` when a timeout passes, and stopping
    closes the mailbox and cancels the running request, which wakes the actor.
    """

    __slots__ = (
        "current",
        "end_detail",
        "end_reason",
        "expires_at",
        "id",
        "idle_queued",
        "idle_since",
        "mailbox",
        "model",
        "model_id",
        "opened_at",
        "owner",
        "replica",
        "state",
        "streaming",
        "supervisor",
    )

    def __init__(
        self,
        sequence_id: str,
        supervisor: ActorSupervisor,
        model: Model,
        replica: ContinuousBatcher | None,
        max_queue: int,
        state: Any = None,
        owner: str | None = None,
        model_id: str | None = None,
    ) -> None:
        #: the id its client named (every answer and error names this one)
        self.id = sequence_id
        #: the fingerprint of the token that opened it (bound to tokens), else None
        self.owner = owner
        #: the id the model knows it by (``new_state``, evictions): unique per (owner,
        #: id), so two owners' sequences of one name never share a model's state
        self.model_id = sequence_id if model_id is None else model_id
        self.supervisor = supervisor
        self.model = model
        self.replica = replica
        self.mailbox: Mailbox[Job] = Mailbox(max_queue, name=f"sequence {sequence_id!r}")
        self.current: Job | None = None
        self.end_reason: EndReason | None = None
        self.end_detail: str | None = None  # why, when the model asked (see ended())
        self.opened_at = trio.current_time()
        self.idle_since: float | None = self.opened_at  # None while a request runs
        self.idle_queued = False  # an idle deadline of ours is in the supervisor's heap
        self.state = state  # lent to the model's step only while a request of ours runs
        #: earlier requests still streaming while later ones run (``sequence_overlap``)
        self.streaming: list[WorkItem] = []

    @property
    def idle(self) -> bool:
        """No request runs, waits or streams (a request that has just finished counts
        as gone: its caller has its answer, the actor only has not woken up yet)."""
        current = self.current
        return (current is None or current.item.finished) and not len(self.mailbox) and not self.streaming

    @property
    def ending(self) -> EndReason | None:
        """Why the sequence ends, if it does: the reason it was stopped with, or
        ``ended`` once the request that ends it has finished well (its caller has its
        answer, even if this actor has not woken up yet to see it)."""
        current = self.current
        if self.end_reason is None and current is not None:
            item = current.item
            if item.finished and item.error is None and (current.end or item.ends_sequence):
                self.end_reason = EndReason.ENDED
                self.mailbox.close()
        return self.end_reason

    def deliver(self, job: Job) -> None:
        """Queue ``job``; :class:`Overloaded` if the mailbox is full,
        :class:`trio.ClosedResourceError` if the sequence is ending."""
        self.mailbox.send_nowait(job)

    def stop(self, reason: EndReason, *, graceful: bool = False, detail: str | None = None) -> None:
        """End the sequence now: the running request stops at its next step. With
        ``graceful`` the running request may finish (queued and later ones are refused
        with ``reason``); a later plain ``stop`` still stops it. ``detail``: see :func:`ended`."""
        if self.end_reason is None:
            self.end_reason, self.end_detail = reason, detail
            self.mailbox.close()
        if not graceful and self.current is not None and not self.current.item.finished:
            self.current.item.cancel(self._why())
        for item in list(self.streaming):
            item.cancel(self._why())

    def _as_client(self, exc: ActorServeError) -> ActorServeError:
        """``exc`` (the model's), naming the client's id where it named the model's."""
        model_id = self.model_id
        if model_id != self.id and exc.args and isinstance(exc.args[0], str) and model_id in exc.args[0]:
            exc.args = (exc.args[0].replace(model_id, self.id), *exc.args[1:])
        return exc

    def _why(self) -> SequenceNotFound:
        return ended(self.id, self.end_reason or EndReason.ENDED, self.end_detail)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        del task_status  # it holds trio's start-up nursery (about 1 KiB per sequence)
        reason = EndReason.FAILED
        try:
            mailbox = self.mailbox
            while self.end_reason is None:
                try:
                    job = await mailbox.receive()
                except trio.EndOfChannel:
                    break
                if self.end_reason is not None:
                    job.item.fail(self._why())
                    break
                if job.item.cancelled:  # its caller went away while it waited
                    job.item.finish()
                    continue
                self.current = job  # stays set if we are cancelled: _finish stops it
                self.idle_since = None
                await self._run_job(job, self.state)
                if job.end and not job.item.finished:  # the last request streams on
                    await job.item.done.wait()
                self.current = None
                if isinstance(job.item.error, ModelFailed) and self.end_reason is None:
                    self.end_reason = EndReason.FAILED  # the model broke on it: its state is suspect
                    break
                if (job.end or job.item.ends_sequence) and self.end_reason is None:
                    self.end_reason = EndReason.ENDED
                    break
                if not job.item.finished:  # still streaming (sequence_overlap)
                    self.streaming.append(job.item)
                    job.item.on_finish = functools.partial(self._stream_left, job.item)
                del job
                if not self.streaming:
                    self.idle_since = trio.current_time()
                    self.supervisor.became_idle(self)
            reason = self.end_reason or EndReason.ENDED
        except trio.Cancelled:
            reason = self.end_reason or EndReason.SHUTDOWN
            raise
        except Exception as exc:
            self.end_reason = EndReason.FAILED
            failure = ModelFailed.wrap(self.model.name, exc, f"in sequence {self.id!r}")
            if self.current is not None:
                self.current.item.fail(failure)
        finally:
            with trio.CancelScope(shield=True):
                await self._finish(reason)

    def _stream_left(self, item: WorkItem) -> None:
        """A request that streamed on while later ones ran has finished."""
        self.streaming.remove(item)
        if item.ends_sequence and self.end_reason is None:
            self.stop(EndReason.ENDED)
        elif not self.streaming and self.current is None and self.end_reason is None:
            self.idle_since = trio.current_time()
            self.supervisor.became_idle(self)

    async def _run_job(self, job: Job, state: Any) -> None:
        item = job.item
        model = self.model
        if isinstance(model, BatchModel):
            try:
                await model.prepare(item.request, state)
                item.work = model.begin(item.request, state)
            except ActorServeError as exc:
                item.fail(self._as_client(exc))  # a bad request fails itself, not the sequence
                return
            assert self.replica is not None
            if model.sequence_overlap:
                item.progressed = trio.Event()
            try:
                self.replica.submit_nowait(item)
            except ActorServeError as exc:
                item.fail(exc)
                return
        else:
            assert job.turn is not None
            job.turn.set()  # the caller runs the plain model in its own task
        await (item.done if item.progressed is None else item.progressed).wait()

    async def _finish(self, reason: EndReason) -> None:
        """Fail what is queued, stop what runs, wait for it to leave the batch, then
        unregister and call on_sequence_end exactly once."""
        self.end_reason = self.end_reason or reason
        why = self._why()
        for job in self.mailbox.drain():
            job.item.fail(why)
            if job.turn is not None:
                job.turn.set()
        running = self.current.item if self.current is not None else None
        for item in list(self.streaming):
            item.on_finish = None
            await self._stop_running(item, why)
        self.streaming.clear()
        if running is not None:
            await self._stop_running(running, why)
        self.supervisor.forget(self, reason)
        if isinstance(self.model, BatchModel):
            try:
                self.model.on_sequence_end(self.state, reason)
            except Exception:
                log.exception("model %r: on_sequence_end(%r) raised", self.model.name, reason)

    async def _stop_running(self, running: WorkItem, why: SequenceNotFound) -> None:
        if not running.finished:
            if running.batcher is None:
                running.fail(why)
            else:
                running.cancel(why)
                with trio.move_on_after(LEAVE_BATCH_TIMEOUT) as waited:
                    await running.done.wait()
                if waited.cancelled_caught:
                    log.error(
                        "sequence %r: its request did not leave the batch in %.0f s",
                        self.id,
                        LEAVE_BATCH_TIMEOUT,
                    )
