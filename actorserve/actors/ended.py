"""The recently ended sequence ids a :class:`~.supervisor.Supervisor` remembers, so that
a late request hears *why* its sequence is gone (``expired``, ``was evicted (...)``)
rather than that its id is unknown; told only to the owner that opened it."""

from __future__ import annotations

from collections import OrderedDict

from ..api import EndReason
from ..errors import SequenceNotFound
from .sequence import ended

#: how many ended sequence ids are remembered to explain a late request.
REMEMBER_ENDED = 4096


class EndedIds:
    """Ended id -> (why, its owner, the model's detail), the :data:`REMEMBER_ENDED` latest."""

    __slots__ = ("_ids", "limit")

    def __init__(self, limit: int = REMEMBER_ENDED) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, tuple[EndReason, str | None, str | None]] = OrderedDict()

    def remember(self, sequence_id: str, reason: EndReason, owner: str | None, detail: str | None) -> None:
        self._ids[sequence_id] = (reason, owner, detail)
        self._ids.move_to_end(sequence_id)
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def reopened(self, sequence_id: str) -> None:
        """``sequence_id`` is open again: a request for it no longer hears why it ended."""
        self._ids.pop(sequence_id, None)

    def error(self, sequence_id: str, owner: str | None) -> SequenceNotFound | None:
        """What a request of ``owner`` for ``sequence_id`` is told, if it ended here."""
        entry = self._ids.get(sequence_id)
        if entry is None or entry[1] != owner:  # another owner's: told apart by nothing
            return None
        return ended(sequence_id, entry[0], entry[2])
