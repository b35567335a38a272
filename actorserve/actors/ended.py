"""The recently ended sequence ids a :class:`~.supervisor.Supervisor` remembers, so that
a late request hears *why* its sequence is gone (``expired``, ``was evicted (...)``)
rather than that its id is unknown; told only to the owner that opened it. Kept per
(owner, id): two owners' sequences of one name end apart, and one's end never tells
another owner that the name was in use."""

from __future__ import annotations

from collections import OrderedDict

from ..api import EndReason
from ..errors import SequenceNotFound
from .sequence import ended

#: how many ended sequence ids are remembered to explain a late request.
REMEMBER_ENDED = 4096


class EndedIds:
    """(owner, ended id) -> (why, the model's detail), the :data:`REMEMBER_ENDED` latest
    of all owners together."""

    __slots__ = ("_ids", "limit")

    def __init__(self, limit: int = REMEMBER_ENDED) -> None:
        self.limit = limit
        self._ids: OrderedDict[tuple[str | None, str], tuple[EndReason, str | None]] = OrderedDict()

    def remember(self, sequence_id: str, reason: EndReason, owner: str | None, detail: str | None) -> None:
        key = (owner, sequence_id)
        self._ids[key] = (reason, detail)
        self._ids.move_to_end(key)
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def reopened(self, sequence_id: str, owner: str | None) -> None:
        """``owner``'s ``sequence_id`` is open again: a request for it no longer hears
        why it ended."""
        self._ids.pop((owner, sequence_id), None)

    def error(self, sequence_id: str, owner: str | None) -> SequenceNotFound | None:
        """What a request of ``owner`` for ``sequence_id`` is told, if ``owner``'s
        sequence of that id ended here (another owner's is told apart by nothing)."""
        entry = self._ids.get((owner, sequence_id))
        if entry is None:
            return None
        return ended(sequence_id, entry[0], entry[1])
