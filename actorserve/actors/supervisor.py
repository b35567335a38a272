"""The supervisor: a nursery that owns every :class:`SequenceActor` of one model version.

It opens sequences (``sequence_start``), routes requests to their actor's mailbox,
cancels sequences, enforces ``max_sequences`` (refusing, or evicting the least recently
used idle sequence with ``evict_idle``) and remembers recently ended ids so that a late
request hears *why* its sequence is gone.

Server-made ids carry 128 random bits (:func:`actorserve.replica.new_sequence_id`): an
id is a bearer secret, whoever holds it may continue, end or cancel the sequence. When sequences are bound to
tokens, a request names its ``owner`` (the fingerprint of its token) and each owner has
an id space of its own (:mod:`.registry`: sequences are kept per (owner, id), the model
knows each by an id unique per (owner, id)): a sequence opened by one owner is unknown
to every other (the same 404 as an id never opened), and another owner's start of the
same id opens that owner's own sequence (never a 409 that would tell the id is in use).
An owner holds at most ``max_sequences_per_token`` open sequences, and eviction makes
room only among the sequences of the owner asking.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Callable, Collection, Iterable
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any

import attrs
import trio

from ..api import EndReason, RequestControl
from ..errors import (
    ModelFailed,
    Overloaded,
    SequenceConflict,
    SequenceNotFound,
    SequenceNotHeld,
    ShuttingDown,
)
from ..metrics import ModelMetrics
from ..model import BatchModel, Model
from ..replica import new_sequence_id
from ..settings import SequenceSettings
from .batcher import ContinuousBatcher
from .ended import EndedIds
from .registry import SequenceIds
from .sequence import Job, SequenceActor, ended

log = logging.getLogger(__name__)

#: deadlines of ended sequences tolerated before they are swept out of the heap
COMPACT_SLACK = 64
#: the most a refusal's ``Retry-After`` says (seconds), however far the next expiry is
MAX_RETRY_AFTER = 3600


@attrs.frozen
class SupervisorStatistics:
    open_sequences: int
    max_sequences: int
    started: int
    #: requests waiting in open sequences' mailboxes behind a running one
    queued: int
    #: reason (the :class:`EndReason` value) -> sequences ended so
    ended: dict[str, int]


class Supervisor:
    """Start :meth:`run` with ``nursery.start``; then :meth:`submit` and
    :meth:`cancel` from any task of the same trio run."""

    def __init__(
        self,
        model: Model,
        settings: SequenceSettings,
        pick_replica: Callable[[], ContinuousBatcher | None],
        *,
        name: str = "supervisor",
        metrics: ModelMetrics | None = None,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.settings = settings
        self.name = name
        self._pick_replica = pick_replica
        self._ids = SequenceIds()
        #: ended ids, to explain a late request (to its owner only)
        self._ended = EndedIds()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self.started = 0
        self.ended_by_reason: dict[str, int] = {}
        #: open sequences per replica they are pinned to
        self._pinned: dict[ContinuousBatcher | None, int] = {}
        # Timeouts of every sequence in one heap of (when, n, actor, is_max_duration),
        # served by one reaper task: cheaper than a cancel scope per sequence.
        self._deadlines: list[tuple[float, int, SequenceActor, bool]] = []
        self._order = itertools.count()
        self._reaper_target = math.inf
        self._reaper_wake = trio.Event()

    def __len__(self) -> int:
        return len(self._ids)

    def statistics(self) -> SupervisorStatistics:
        """Counters; ``queued`` walks every open sequence (fine for an occasional look,
        not for every request)."""
        queued = sum(len(actor.mailbox) for actor in self._ids.actors())
        return SupervisorStatistics(
            len(self._ids), self.settings.max_sequences, self.started, queued, dict(self.ended_by_reason)
        )

    def actor(self, sequence_id: str, owner: str | None = None) -> SequenceActor | None:
        return self._ids.get(sequence_id, owner)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reap)
                task_status.started()
        finally:
            self._closing = True

    # -- timeouts ------------------------------------------------------------------------

    def _schedule(self, when: float, actor: SequenceActor, max_duration: bool) -> None:
        heap = self._deadlines
        if len(heap) > 2 * len(self._ids) + COMPACT_SLACK:
            # the deadlines of ended sequences (at most 2 per open one otherwise) would
            # keep their actors, states and mailboxes alive until they are due: with a
            # 600 s idle timeout, RSS grew by ~0.7 KiB per sequence for 10 minutes
            heap[:] = [entry for entry in heap if entry[2].end_reason is None]
            heapify(heap)
        heappush(heap, (when, next(self._order), actor, max_duration))
        if when < self._reaper_target:
            self._reaper_wake.set()

    def became_idle(self, actor: SequenceActor) -> None:
        """An actor finished a request: make sure its idle deadline is watched."""
        if self.settings.idle_timeout_ms and not actor.idle_queued and actor.idle_since is not None:
            actor.idle_queued = True
            self._schedule(actor.idle_since + self.settings.idle_timeout_ms / 1000, actor, False)

    async def _reap(self) -> None:
        """Stop sequences whose idle time or total time ran out."""
        while True:
            self._reaper_target = self.expire_due(trio.current_time())
            self._reaper_wake = trio.Event()
            with trio.move_on_at(self._reaper_target):
                await self._reaper_wake.wait()

    def expire_due(self, now: float) -> float:
        """Stop every sequence whose deadline is ``now`` or earlier (the reaper's look;
        synchronous, so a test can place it between two events). Returns when the
        next deadline is due.

        A sequence with a request queued in its mailbox is busy, not idle, even if its
        actor has not picked the request up yet: the request came in time."""
        idle = self.settings.idle_timeout_ms / 1000
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, actor, max_duration = heappop(heap)
            if actor.end_reason is not None:
                continue
            if max_duration:
                actor.stop(EndReason.EXPIRED)
                continue
            actor.idle_queued = False
            if actor.idle_since is None or len(actor.mailbox):
                continue  # busy: queued again when it is idle again
            due = actor.idle_since + idle
            if due <= now:
                actor.stop(EndReason.EXPIRED)
            else:  # it was used since this entry was made
                actor.idle_queued = True
                heappush(heap, (due, next(self._order), actor, False))
        return heap[0][0] if heap else math.inf

    def pinned_count(self, replica: ContinuousBatcher) -> int:
        """How many open sequences ``replica`` serves (for routing new ones)."""
        return self._pinned.get(replica, 0)

    def pinned(self, replica: ContinuousBatcher) -> list[SequenceActor]:
        """The open sequences whose requests ``replica`` steps."""
        return [actor for actor in self._ids.actors() if actor.replica is replica]

    def end_pinned(self, replica: ContinuousBatcher, reason: EndReason, *, graceful: bool) -> None:
        """End the sequences pinned to ``replica`` (being removed) with ``reason``;
        ``graceful``: their running requests may finish (see :meth:`SequenceActor.stop`)."""
        for actor in self.pinned(replica):
            actor.stop(reason, graceful=graceful)

    def end_all(self, reason: EndReason) -> None:
        """End every open sequence with ``reason`` and accept no new ones."""
        self._closing = True
        for actor in list(self._ids.actors()):
            actor.stop(reason)

    async def submit(self, job: Job, control: RequestControl) -> SequenceActor:
        """Route ``job`` to its sequence, opening it on ``control.start``.

        Raises :class:`SequenceConflict`, :class:`SequenceNotFound`, :class:`Overloaded`
        or :class:`ShuttingDown`; on success the job is queued in the actor's mailbox.
        """
        if control.start:
            actor = await self._open(control.sequence_id, control.owner)
        else:
            actor = self._find(control.sequence_id, control.owner)
        params = job.item.request.parameters
        if actor.model_id != actor.id and "sequence_id" in params:
            params["sequence_id"] = actor.model_id  # the model sees one id for its sequence
        try:
            actor.deliver(job)
        except trio.ClosedResourceError:
            raise ended(actor.id, actor.end_reason or EndReason.ENDED, actor.end_detail) from None
        except Overloaded:
            raise Overloaded(
                f"sequence {actor.id!r} already has {self.settings.max_queue} requests queued (max_queue)",
                bound="mailbox_full",
            ) from None
        if control.end:
            job.end = True
        self._ids.touch(actor)
        return actor

    def cancel(self, sequence_id: str | None, owner: str | None = None) -> str:
        """Cancel an open sequence: its running request stops at the next step."""
        actor = self._find(sequence_id, owner)
        if actor.ending is not None:  # it ends anyway: say why, don't claim to cancel it
            raise ended(actor.id, actor.ending, actor.end_detail)
        self._let_go(actor, EndReason.CANCELLED)
        return actor.id

    def _find(self, sequence_id: str | None, owner: str | None = None) -> SequenceActor:
        if sequence_id is None:
            raise SequenceNotFound("a request without sequence_start must carry a sequence_id")
        actor = self._ids.get(sequence_id, owner)
        if actor is not None:
            return actor
        # another owner's sequence of this id is told apart from an unknown id by nothing
        why = self._ended.error(sequence_id, owner)
        if why is not None:
            raise why
        # never ended here: the engine names this replica (replica.not_held); never fresh state
        raise SequenceNotHeld(
            sequence_id, f"sequence {sequence_id!r} is not open (unknown id; start it with sequence_start)"
        )

    async def _open(self, sequence_id: str | None, owner: str | None = None) -> SequenceActor:
        if self._closing or self._nursery is None:
            raise ShuttingDown(f"{self.name} is shutting down")
        if sequence_id is None:
            sequence_id = new_sequence_id()
        old = self._ids.get(sequence_id, owner)
        if old is not None:  # the asker's own (bound: another owner's id is free to it)
            if old.ending is None:
                raise SequenceConflict(f"sequence {sequence_id!r} is already open")
            # Ending (expired, ended, ...) but its actor has not finished yet: the id is
            # free again. The old actor still ends once, with its own reason.
            self._ids.remove(old)
        per_token = self.settings.max_sequences_per_token
        if owner is not None and per_token and self._ids.held_by(owner) >= per_token:
            self._make_room(self._ids.least_recently_used(owner), "max_sequences_per_token")
        elif len(self._ids) >= self.settings.max_sequences:
            # bound to tokens: room is made among the asker's own sequences only
            self._make_room(self._ids.least_recently_used(owner), "max_sequences")
        # The replica first: its own model instance makes, begins and ends the
        # sequence's state (replicas are replaced when they hang or are recycled).
        replica = self._pick_replica()
        model = replica.model if replica is not None else self.model
        model_id = self._ids.model_id(sequence_id, owner)
        state: Any = None
        if isinstance(model, BatchModel):
            try:
                state = model.new_state(model_id)
            except Exception as exc:
                raise ModelFailed.wrap(model.name, exc, f"to start sequence {sequence_id!r}") from None
            if model.evictions.listener is None:  # woken on the event loop, from any thread
                wake = trio.lowlevel.current_trio_token().run_sync_soon
                model.evictions.listen(functools.partial(wake, self.evict_requested, model))
        actor = SequenceActor(
            sequence_id, self, model, replica, self.settings.max_queue, state, owner, model_id
        )
        self._ids.add(actor)
        self._pinned[actor.replica] = self._pinned.get(actor.replica, 0) + 1
        self._ended.reopened(sequence_id, owner)
        self.started += 1
        if self.metrics is not None:
            self.metrics.sequences_started.inc()
            self.metrics.sequences_open.inc()
        await self._nursery.start(actor.run)
        if self.settings.max_duration_ms:
            self._schedule(trio.current_time() + self.settings.max_duration_ms / 1000, actor, True)
        self.became_idle(actor)
        return actor

    def evict_requested(self, model: BatchModel[Any, Any]) -> None:
        """End, with reason ``evicted``, the sequences ``model`` asked to evict (see
        :meth:`BatchModel.evict_sequence`) that are still open, its own and idle; a busy
        one stays open. Runs as a ``run_sync_soon`` callback: it must not raise."""
        for model_id, why in model.evictions.take().items():  # the ids the model knows
            actor = self._ids.by_model_id(model_id)
            if actor is not None and actor.model is model and actor.ending is None and actor.idle:
                try:
                    self._let_go(actor, EndReason.EVICTED, why)
                except Exception:
                    log.exception("%s: evicting sequence %r failed", self.name, model_id)

    def _make_room(self, candidates: Collection[SequenceActor], limit: str) -> None:
        """Evict the least recently used idle sequence of ``candidates`` (with
        ``evict_idle``), or refuse with :class:`Overloaded` naming ``limit``, with a
        ``retry_after`` that tells when the first of them can expire."""
        if self.settings.evict_idle:
            for actor in candidates:  # least recently used first
                if actor.idle:
                    self._let_go(actor, EndReason.EVICTED)
                    return
        if limit == "max_sequences":
            what = f"{self.settings.max_sequences} sequences are open (max_sequences)"
            retry_after = self._retry_after_all()
        else:
            what = f"this token holds {self.settings.max_sequences_per_token} open sequences ({limit})"
            retry_after = self._retry_after_of(candidates)
        raise Overloaded(f"{self.name}: {what}", retry_after=retry_after, bound="max_sequences")

    def _retry_after_all(self) -> int:
        """Seconds until the first deadline of an open sequence. Entries at the top of
        the heap that no longer say when their sequence expires are settled first, as
        the reaper would settle them when due: an ended sequence's is dropped, a busy
        one's too (it is queued again once idle), one used since is moved to its new
        deadline."""
        idle = self.settings.idle_timeout_ms / 1000
        heap = self._deadlines
        while heap:
            when, _, actor, max_duration = heap[0]
            if actor.end_reason is None:
                if max_duration:
                    break
                since = actor.idle_since
                if since is not None and not len(actor.mailbox):
                    if since + idle <= when:
                        break
                    heapreplace(heap, (since + idle, next(self._order), actor, False))
                    continue
                actor.idle_queued = False
            heappop(heap)
        return _seconds_until(heap[0][0] if heap else math.inf)

    def _retry_after_of(self, actors: Iterable[SequenceActor]) -> int:
        """Seconds until the first of ``actors`` can expire (few: one owner's)."""
        settings = self.settings
        due = math.inf
        for actor in actors:
            if settings.max_duration_ms:
                due = min(due, actor.opened_at + settings.max_duration_ms / 1000)
            if settings.idle_timeout_ms and actor.idle_since is not None:
                due = min(due, actor.idle_since + settings.idle_timeout_ms / 1000)
        return _seconds_until(due)

    def _let_go(self, actor: SequenceActor, reason: EndReason, detail: str | None = None) -> None:
        """Stop ``actor`` and free its id now (its request may take a step to leave the
        batch): a request for that id meanwhile hears why the sequence is gone."""
        self._ids.remove(actor)
        why = actor.ending or reason  # ``ending`` first: it may settle ``ended``
        actor.stop(reason, detail=detail)
        self._ended.remember(actor.id, why, actor.owner, actor.end_detail)

    def forget(self, actor: SequenceActor, reason: EndReason) -> None:
        """Called by an actor as it ends (exactly once)."""
        self._pinned[actor.replica] -= 1
        self._ids.remove(actor)
        if self._ids.get(actor.id, actor.owner) is None:  # not opened again meanwhile
            self._ended.remember(actor.id, reason, actor.owner, actor.end_detail)
        key = reason.value
        self.ended_by_reason[key] = self.ended_by_reason.get(key, 0) + 1
        if self.metrics is not None:
            self.metrics.sequences_open.dec()
            self.metrics.sequences_ended[key].inc()


def _seconds_until(when: float) -> int:
    """A ``Retry-After`` for a slot that can free at ``when``: whole seconds, at least 1
    (also when no deadline is known: a busy sequence may end at any moment) and at most
    :data:`MAX_RETRY_AFTER`."""
    if when == math.inf:
        return 1
    return max(1, min(MAX_RETRY_AFTER, math.ceil(when - trio.current_time())))
