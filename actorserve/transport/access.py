"""The access log: one structured line per request, written off the request path.

A finished request hands its fields (a tuple) to :meth:`AccessLog.add`, which only
appends to a bounded deque (no formatting, no I/O, no lock). :meth:`AccessLog.run`, a
task in the transports' nursery, takes whatever has gathered every ``FLUSH_SECONDS`` and
formats and emits it in a worker thread, through the logger ``actorserve.access``: one
log record per line (each with the time of its request), so an embedder's logging setup
applies. The command line installs :class:`AccessHandler` on that logger instead, which
formats a whole batch itself (text, or JSON with ``--log-format json``) and writes it in
one write: a record per line costs ~18 us of the logging module, a line here ~3 us.
A line that finds the deque full is dropped and counted; the next flush says how many.

A sequence id is a bearer secret (docs/security.md), so no line holds one: the field
``sequence`` is a short keyed hash of it (:func:`sequence_hash`, BLAKE2b under a random key
each :class:`AccessLog` makes), the same for every line of one sequence in one process, so
lines can be told apart and correlated, but no id can be read back or tested against a
guess from the log. Lines leave an :class:`AccessLog` only through its flush, which hashes.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import secrets
import time
from collections import deque
from typing import Final, TextIO

import orjson
import trio

#: the logger every access line goes to
ACCESS_LOGGER: Final = "actorserve.access"

#: the fields of a line, in order (JSON keys; ``key=value`` in text)
FIELDS: Final = (
    "transport",
    "method",
    "route",
    "status",
    "bytes",
    "duration_ms",
    "model",
    "version",
    "sequence",
)

#: hex digits of :func:`sequence_hash` (64 bits: enough to tell a process's sequences apart)
SEQUENCE_HASH_DIGITS: Final = 16

#: seconds between two flushes (a line appears at most this late)
FLUSH_SECONDS: Final = 0.1
#: lines waiting for a flush at most; more are dropped (and counted)
MAX_WAITING: Final = 65536

#: the time of the request (``time.time()``), then the :data:`FIELDS`
Line = tuple[float, str, str, str, int | str, int | None, float, str | None, str | None, str | None]

log = logging.getLogger(ACCESS_LOGGER)


def sequence_hash(sequence_id: str, key: bytes) -> str:
    """The access log's name for ``sequence_id``: :data:`SEQUENCE_HASH_DIGITS` hex digits
    of BLAKE2b keyed with ``key`` (so a guessed id cannot be checked against the log)."""
    digest = hashlib.blake2b(sequence_id.encode("utf-8", "surrogatepass"), key=key, digest_size=8)
    return digest.hexdigest()


def fields_of(line: Line) -> dict[str, object]:
    return dict(zip(FIELDS, line[1:], strict=True))


def escape(value: str) -> str:
    """``value`` with every character that could forge a line or a field escaped as
    Python does (``\\n``, ``\\x1b``, ``\\u2028``): control and other non-printable
    characters, spaces and backslashes. The fields come from clients (a path's ``%0a``
    is a newline by the time it is logged); printable text is returned as it is."""
    if value.isprintable() and " " not in value and "\\" not in value:
        return value  # the common case, checked at C speed
    return "".join(_escaped(c) for c in value)


def _escaped(char: str) -> str:
    if char == " ":
        return "\\x20"
    if char == "\\":
        return "\\\\"
    if char.isprintable():
        return char
    return repr(char)[1:-1]


def text_of(line: Line) -> str:
    """``rest POST /v2/models/m/infer status=200 bytes=84 duration_ms=1.234 model=m ...``,
    every field from the client escaped (:func:`escape`)."""
    _, transport, method, route, status, size, duration, model, version, sequence = line
    return (
        f"{transport} {escape(method)} {escape(route)} status={status} bytes={'-' if size is None else size} "
        f"duration_ms={duration:.3f} model={escape(model or '-')} version={escape(version or '-')} "
        f"sequence={escape(sequence or '-')}"
    )


class AccessLog:
    """Collects access lines from the event loop (or grpclib's loop, on the same thread)
    and writes them in batches; :meth:`run` it in a nursery for as long as requests come."""

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self._lines: deque[Line] = deque()
        self._max = max_waiting
        self.dropped = 0
        #: the key of this log's :func:`sequence_hash` (never written anywhere)
        self._key = secrets.token_bytes(32)

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
        for i, line in enumerate(batch):  # the one way out: no id leaves unhashed
            if line[-1] is not None:
                batch[i] = (*line[:-1], sequence_hash(line[-1], self._key))
        dropped, self.dropped = self.dropped, 0
        return batch, dropped


def _emit(batch: list[Line], dropped: int) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    batched = [h for h in log.handlers if isinstance(h, AccessHandler)]
    if batched and not log.propagate:
        for handler in batched:
            handler.write_batch(batch)
    else:
        for line in batch:
            record = log.makeRecord(
                log.name,
                logging.INFO,
                __file__,
                0,
                "%s",
                (text_of(line),),
                None,
                extra={"access": fields_of(line)},
            )
            record.created, record.msecs = line[0], (line[0] % 1) * 1000
            log.handle(record)
    if dropped:
        log.warning("access log: %d line(s) dropped (more than %d waited for a flush)", dropped, MAX_WAITING)


__all__ = [
    "ACCESS_LOGGER",
    "FIELDS",
    "SEQUENCE_HASH_DIGITS",
    "AccessHandler",
    "AccessLog",
    "Line",
    "escape",
    "fields_of",
    "sequence_hash",
    "text_of",
]


class AccessHandler(logging.StreamHandler[TextIO]):
    """The command line's handler of ``actorserve.access`` (installed with
    ``propagate = False``): a batch of lines is formatted here and written at once, in
    the same shape as the other log lines (text, or ``json``: one object a line with the
    fields as keys). A record logged the usual way (the dropped-lines warning) is
    formatted by the handler's formatter as any other."""

    def __init__(self, stream: TextIO, log_format: str = "text") -> None:
        super().__init__(stream)
        self.json = log_format == "json"
        self._second = -1
        self._stamp = ""

    def _time(self, when: float) -> str:
        """The line's time as the other lines show it (cached per second)."""
        second = int(when)
        if second != self._second:
            self._second = second
            if self.json:
                self._stamp = datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat()[:19]
            else:
                self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        millis = int((when - second) * 1000)
        return f"{self._stamp}.{millis:03d}+00:00" if self.json else f"{self._stamp},{millis:03d}"

    def format_line(self, line: Line) -> str:
        if self.json:
            head = {
                "time": self._time(line[0]),
                "level": "INFO",
                "logger": ACCESS_LOGGER,
                "message": text_of(line),
            }
            return orjson.dumps({**head, **fields_of(line)}).decode()
        return f"{self._time(line[0])} INFO {ACCESS_LOGGER}: {text_of(line)}"

    def write_batch(self, batch: list[Line]) -> None:
        text = "".join([self.format_line(line) + "\n" for line in batch])
        with self.lock:  # type: ignore[union-attr]
            self.stream.write(text)
            self.flush()
