"""The KV cache budget of the ``transformers`` runtime (``kv_cache_budget_mb``): idle
sequences' caches, running requests' reservations and the prefix cache share it
(docs/llm.md#the-kv-cache-budget).

A request reserves, when it begins, room for its whole context and what it may generate
(up to the end of the context); the room is made by dropping prefix-cache blocks first,
then idle sequences' caches (soft eviction: the sequence stays open and reads its text
again on its next request). With sequences bound to tokens a request drops only its own
owner's idle caches and is refused with 429 rather than touch another's. ``begin`` runs
on the event loop and a request settles in the step thread, so every call here takes
the lock.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import attrs

from ...errors import Overloaded
from .forward import kv_bytes
from .prefix import BLOCK, Block, PrefixCache
from .state import LLMState, LLMWork


@attrs.frozen
class CacheStatistics:
    """The KV cache of a ``transformers`` model (``TransformersModel.cache_statistics``):
    tokens read by prefill forwards and tokens taken from the prefix cache instead, since
    load; the bytes held now by idle sequences, reserved by running requests and held by
    the prefix cache (in ``prefix_blocks``); sequence caches dropped by the budget (the
    sequences stay open) and requests refused with 429."""

    prefilled_tokens: int
    reused_tokens: int
    sequence_bytes: int
    reserved_bytes: int
    prefix_bytes: int
    prefix_blocks: int
    dropped_caches: int
    refused: int


class KVBudget:
    """``limit`` bytes of KV for the open ``sequences`` (the model's dict, least recently
    used first: mutated here only, under the lock), the running requests and the prefix
    cache (None: ``prefix_cache`` false). ``token_bytes``: one position's KV, set once the
    model has loaded."""

    def __init__(self, model: str, limit: int, sequences: OrderedDict[str, LLMState], reuse: bool) -> None:
        self.model = model
        self.limit = limit
        self.sequences = sequences
        self.prefix: PrefixCache | None = PrefixCache() if reuse else None
        self.token_bytes = 0
        self.lock = threading.Lock()
        #: running requests -> (owner, bytes reserved); weak: a request dropped before it
        #: ran (its batcher refused it) releases its reservation too
        self._reserved: weakref.WeakKeyDictionary[LLMWork, tuple[str | None, int]] = (
            weakref.WeakKeyDictionary()
        )
        self.prefilled = 0  # counted by the step thread
        self._reused = self._dropped = self._refused = 0

    # -- sequences ------------------------------------------------------------------------------

    def open(self, state: LLMState) -> None:
        assert state.sequence_id is not None
        with self.lock:
            self.sequences[state.sequence_id] = state

    def close(self, state: LLMState) -> None:
        with self.lock:
            state.kv, state.ids = None, []
            # only its own entry: its id may have been opened again while it ended
            if state.sequence_id is not None and self.sequences.get(state.sequence_id) is state:
                del self.sequences[state.sequence_id]

    def held_bytes(self) -> int:
        """The bytes of KV held now: the sequences' caches and the prefix cache."""
        with self.lock:
            prefix = self.prefix.nbytes if self.prefix is not None else 0
            return sum(kv_bytes(s.kv) for s in self.sequences.values()) + prefix

    def statistics(self) -> CacheStatistics:
        with self.lock:
            return CacheStatistics(
                prefilled_tokens=self.prefilled,
                reused_tokens=self._reused,
                sequence_bytes=sum(kv_bytes(s.kv) for s in self.sequences.values() if not s.busy),
                reserved_bytes=sum(nbytes for _, nbytes in self._reserved.values()),
                prefix_bytes=self.prefix.nbytes if self.prefix is not None else 0,
                prefix_blocks=len(self.prefix) if self.prefix is not None else 0,
                dropped_caches=self._dropped,
                refused=self._refused,
            )

    # -- a request ------------------------------------------------------------------------------

    def match(self, owner: str | None, ids: Sequence[int], cached: int) -> list[Block]:
        """The prefix-cache blocks a request reading ``ids`` may start from, when they
        hold more than the ``cached`` tokens its sequence already has (else none). The
        last token is always read again (its logits)."""
        if self.prefix is None or len(ids) - 1 < cached + BLOCK:
            return []
        with self.lock:
            chain = self.prefix.match(owner, ids, len(ids) - 1)
        return chain if len(chain) * BLOCK > cached else []

    def admit(self, state: LLMState, owner: str | None, tokens: int) -> int:
        """Make room for a request of ``state`` that may hold ``tokens`` positions; the
        bytes to :meth:`reserve` for it. Room is made by dropping prefix-cache blocks
        (least recently used first), then the caches of idle sequences, least recently
        used first (soft eviction). A request of an ``owner`` (sequences bound to tokens)
        drops only its owner's own idle caches; if the budget still cannot fit it while
        other owners hold part of it, :class:`Overloaded` (429, Retry-After) and nothing
        of theirs is touched. A request that alone passes the budget runs (running
        requests may pass it; idle caches never keep it passed)."""
        need = tokens * self.token_bytes
        with self.lock:
            total = sum(nbytes for _, nbytes in self._held(state)) + need
            if self.prefix is not None:
                total += self.prefix.nbytes
                if total > self.limit:
                    total -= self.prefix.drop(total - self.limit)
            for other in list(self.sequences.values()):
                if total <= self.limit:
                    break
                if other.busy or other.kv is None or other is state:
                    continue
                if owner is not None and other.owner != owner:
                    continue
                total -= kv_bytes(other.kv)
                other.kv, other.ids = None, []
                self._dropped += 1
            if total > self.limit and owner is not None:
                others = sum(nbytes for who, nbytes in self._held(state) if who != owner)
                if others:
                    self._refused += 1
                    # says nothing of how much the others hold (no oracle of their use)
                    raise Overloaded(
                        f"model {self.model!r}: kv_cache_budget_mb is full; this request needs "
                        f"{need // 2**10} KiB of KV cache: retry later",
                        retry_after=1,
                        bound="kv_cache_budget_mb",
                    )
        return need

    def reserve(self, work: LLMWork, owner: str | None, nbytes: int, reused: int) -> None:
        """``work`` holds ``nbytes`` of the budget until it settles (:meth:`settled`);
        ``reused``: the tokens it takes from the prefix cache."""
        with self.lock:
            self._reserved[work] = (owner, nbytes)
            self._reused += reused
            if work.state.sequence_id is not None:
                self.sequences.move_to_end(work.state.sequence_id)

    def settled(self, work: LLMWork) -> None:
        """``work`` left (finished or cancelled; its cache still readable): release its
        reservation; a request without a sequence leaves its blocks in the prefix cache,
        in the room the sequences and running requests leave."""
        with self.lock:
            self._reserved.pop(work, None)
            if self.prefix is None or work.prefix is not None or work.state.sequence_id is not None:
                return
            if work.cached < BLOCK:
                return
            room = self.limit - sum(nbytes for _, nbytes in self._held(work.state))
            if room > 0:
                self.prefix.add(work.state.owner, work.feed[: work.cached], work.cache(), room)

    def _held(self, besides: LLMState) -> list[tuple[Any, int]]:
        """(owner, bytes) of idle sequences' caches (but ``besides``'s) and running
        requests' reservations (under the lock)."""
        held: list[tuple[Any, int]] = [
            (s.owner, kv_bytes(s.kv))
            for s in self.sequences.values()
            if not s.busy and s.kv is not None and s is not besides
        ]
        held.extend(self._reserved.values())
        return held
