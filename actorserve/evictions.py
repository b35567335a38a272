"""Eviction requests: how a :class:`~actorserve.model.BatchModel` asks the engine to end
an idle sequence with reason ``evicted`` (e.g. when its memory budget is full).

A model calls :meth:`BatchModel.evict_sequence` from ``begin`` or ``step`` (any thread);
the request waits here, bounded, until the engine's supervisor takes it on the event
loop. The supervisor is woken once per batch of requests (not once per request) through
the listener it registers, a thread-safe ``TrioToken.run_sync_soon``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: the most eviction requests of one model instance that wait for the engine at once;
#: more are refused (the model may ask again later)
MAX_PENDING_EVICTIONS = 4096


class EvictionRequests:
    """Sequence ids (with why) waiting for the engine to end them as ``evicted``."""

    __slots__ = ("_listener", "_lock", "_notified", "_pending", "limit")

    def __init__(self, limit: int = MAX_PENDING_EVICTIONS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}  # id -> why (asking twice is asking once)
        self._listener: Callable[[], None] | None = None
        self._notified = False  # the listener was called and nobody took since

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, sequence_id: str, why: str) -> bool:
        """Queue a request; False if :attr:`limit` requests already wait."""
        with self._lock:
            if sequence_id not in self._pending and len(self._pending) >= self.limit:
                return False
            self._pending[sequence_id] = why
            listener = None if self._notified else self._listener
            self._notified = self._notified or listener is not None
        if listener is not None:
            self._call(listener)
        return True

    def take(self) -> dict[str, str]:
        """Every waiting request (id -> why), oldest first; the next one wakes the listener again."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._notified = False
        return pending

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (thread-safe, cheap, never blocking) when requests wait."""
        with self._lock:
            self._listener = listener
            self._notified = listener is not None and bool(self._pending)
        if self._notified and listener is not None:
            self._call(listener)

    @property
    def listener(self) -> Callable[[], None] | None:
        return self._listener

    @staticmethod
    def _call(listener: Callable[[], None]) -> None:
        try:
            listener()
        except Exception:  # the engine's run is over (trio.RunFinishedError): nobody takes them
            log.debug("eviction listener failed", exc_info=True)
