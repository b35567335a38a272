"""The access log: one structured line per request, written off the request path.

A finished request hands its fields (a tuple) to :meth:`AccessLog.add`, which only
appends to a bounded deque (no formatting, no I/O, no lock). :meth:`AccessLog.run`, a
task in the transports' nursery, takes whatever has gathered every ``FLUSH_SECONDS`` and
formats and emits it in a worker thread, through the logger ``actorserve.access`` (so the
server's log format applies: ``--log-format json`` makes each line a JSON object with the
fields as keys). A line that finds the deque full is dropped and counted; the next flush
says how many.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Final

import trio

#: the logger every access line goes to
ACCESS_LOGGER: Final = "actorserve.access"

#: the fields of a line, in order (JSON keys; ``key=value`` in text)
FIELDS: Final = (
    "transport", "method", "route", "status", "bytes", "duration_ms", "model", "version", "sequence_id",
)  # fmt: skip

#: seconds between two flushes (a line appears at most this late)
FLUSH_SECONDS: Final = 0.1
#: lines waiting for a flush at most; more are dropped (and counted)
MAX_WAITING: Final = 65536

Line = tuple[str, str, str, int | str, int | None, float, str | None, str | None, str | None]

log = logging.getLogger(ACCESS_LOGGER)


def fields_of(line: Line) -> dict[str, object]:
    return dict(zip(FIELDS, line, strict=True))


def text_of(line: Line) -> str:
    """``rest POST /v2/models/m/infer status=200 bytes=84 duration_ms=1.234 model=m ...``"""
    transport, method, route, status, size, duration, model, version, sequence = line
    return (
        f"{transport} {method} {route} status={status} bytes={'-' if size is None else size} "
        f"duration_ms={duration:.3f} model={model or '-'} version={version or '-'} sequence_id={sequence or '-'}"
    )


class AccessLog:
    """Collects access lines from the event loop (or grpclib's loop, on the same thread)
    and writes them in batches; :meth:`run` it in a nursery for as long as requests come."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self._lines: deque[Line] = deque()
        self._max = max_waiting
        self.dropped = 0

    def add(self, line: Line) -> None:
        """Queue one line (never blocks, never raises)."""
        if len(self._lines) >= self._max:
            self.dropped += 1
            return
        self._lines.append(line)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush every :data:`FLUSH_SECONDS` until cancelled, then once more."""
        task_status.started()
        try:
            while True:
                await trio.sleep(FLUSH_SECONDS)
                if self._lines or self.dropped:
                    batch, dropped = self._take()
                    await trio.to_thread.run_sync(_emit, batch, dropped)
        finally:
            batch, dropped = self._take()
            _emit(batch, dropped)

    def _take(self) -> tuple[list[Line], int]:
        lines = self._lines
        batch = [lines.popleft() for _ in range(len(lines))]
        dropped, self.dropped = self.dropped, 0
        return batch, dropped


def _emit(batch: list[Line], dropped: int) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    for line in batch:
        log.info("%s", text_of(line), extra={"access": fields_of(line)})
    if dropped:
        log.warning("access log: %d line(s) dropped (more than %d waited for a flush)", dropped, MAX_WAITING)


__all__ = ["ACCESS_LOGGER", "FIELDS", "AccessLog", "Line", "fields_of", "text_of"]
