"""Who holds which sequence id: the open :class:`~.sequence.SequenceActor` s of one
:class:`~.supervisor.Supervisor`, found by the id their client names and by the id their
model knows them by.

Sequences are kept per (owner, client id): when sequences are bound to tokens each
owner (a token's fingerprint) has an id space of its own, so two owners may each hold a
sequence ``s`` and nothing one is told depends on the other's (no answer is an oracle for
the ids another client holds). Unbound, the owner is None and there is one id space.

The **model id** is what the model is given (``new_state``, the request's
``sequence_id``, a TorchServe handler's sequence header) and names back
(``evict_sequence``): unique among the open sequences, so a model keying its memory by
it never mixes two owners' sequences. It is the client's id when unbound (as before),
``<id>@<first 12 hex digits of the owner>`` when bound. Answers name the client's id
(:func:`.replies.stamp` translates what a model echoes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, ValuesView

from .sequence import SequenceActor

#: hex digits of the owner's fingerprint in a bound sequence's model id (48 bits: two
#: tokens' seldom agree, and :meth:`SequenceIds.model_id` settles it when they do)
OWNER_DIGITS = 12


def _key(sequence_id: str, owner: str | None) -> str | tuple[str, str]:
    """The registry's key: the id itself when unbound (as cheap as before: 100,000 idle
    sequences are a normal load), else (owner, id); a str never equals a tuple."""
    return sequence_id if owner is None else (owner, sequence_id)


class SequenceIds:
    """The open sequences by (owner, client id), least recently used first; by model
    id; and per owner (bound to tokens). Touched by its supervisor's task only."""

    __slots__ = ("_actors", "_by_model_id", "_owned")

    def __init__(self) -> None:
        self._actors: OrderedDict[str | tuple[str, str], SequenceActor] = OrderedDict()
        #: model id -> actor, for the actors found under another key (bound ones, and
        #: an unbound one whose id was taken as a model id); the rest are in ``_actors``
        self._by_model_id: dict[str, SequenceActor] = {}
        #: owner -> its open sequences by client id, least recently used first
        self._owned: dict[str, OrderedDict[str, SequenceActor]] = {}

    def __len__(self) -> int:
        return len(self._actors)

    def actors(self) -> ValuesView[SequenceActor]:
        """Every open sequence, least recently used first."""
        return self._actors.values()

    def least_recently_used(self, owner: str | None) -> Collection[SequenceActor]:
        """The sequences eviction may choose from for ``owner``'s start, least recently
        used first: every one (unbound), else that owner's own only."""
        if owner is None:
            return self._actors.values()
        owned = self._owned.get(owner)
        return owned.values() if owned is not None else ()

    def held_by(self, owner: str | None) -> int:
        """How many open sequences ``owner`` holds (0 when unbound)."""
        owned = self._owned.get(owner) if owner is not None else None
        return len(owned) if owned is not None else 0

    def get(self, sequence_id: str, owner: str | None) -> SequenceActor | None:
        """``owner``'s open sequence ``sequence_id`` (another owner's is not there)."""
        return self._actors.get(_key(sequence_id, owner))

    def by_model_id(self, model_id: str) -> SequenceActor | None:
        """The open sequence the model knows as ``model_id``."""
        actor = self._by_model_id.get(model_id)
        if actor is None:
            actor = self._actors.get(model_id)  # unbound: the model id is the key
            if actor is not None and actor.model_id != model_id:
                return None
        return actor

    def model_id(self, sequence_id: str, owner: str | None) -> str:
        """The model id for ``owner``'s new ``sequence_id``: the client's id when
        unbound, else ``<id>@<owner's first 12 hex digits>``; ``#<n>`` is added while
        another open sequence's model id reads the same (an unbound id spelt like a
        bound one, or two fingerprints that begin alike). Bounded: each try skips an
        open sequence."""
        base = sequence_id if owner is None else f"{sequence_id}@{owner[:OWNER_DIGITS]}"
        model_id, n = base, 0
        while self.by_model_id(model_id) is not None:
            n += 1
            model_id = f"{base}#{n}"
        return model_id

    def add(self, actor: SequenceActor) -> None:
        self._actors[_key(actor.id, actor.owner)] = actor
        if actor.owner is not None or actor.model_id != actor.id:
            self._by_model_id[actor.model_id] = actor
        if actor.owner is not None:
            self._owned.setdefault(actor.owner, OrderedDict())[actor.id] = actor

    def touch(self, actor: SequenceActor) -> None:
        """``actor`` was just used: the most recently used (for eviction)."""
        self._actors.move_to_end(_key(actor.id, actor.owner))
        if actor.owner is not None:
            self._owned[actor.owner].move_to_end(actor.id)

    def remove(self, actor: SequenceActor) -> None:
        """Free ``actor``'s ids (client and model) where they still name it: it no
        longer counts, for its owner or against ``max_sequences``."""
        key = _key(actor.id, actor.owner)
        if self._actors.get(key) is actor:
            del self._actors[key]
        if self._by_model_id.get(actor.model_id) is actor:
            del self._by_model_id[actor.model_id]
        owner = actor.owner
        owned = self._owned.get(owner) if owner is not None else None
        if owner is not None and owned is not None and owned.get(actor.id) is actor:
            del owned[actor.id]
            if not owned:
                del self._owned[owner]
