"""Log line formats of ``python -m actorserve``: text (the default) and JSON
(``--log-format json``: one object a line, for log collectors).

A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus
``exception`` when there is one; an access line (logger ``actorserve.access``) adds its
fields (``transport``, ``method``, ``route``, ``status``, ...) as keys of its own.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any, Final

import orjson

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            line.update(access)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


#: third-party protocol loggers that write request headers (``authorization`` included)
#: at DEBUG: hpack logs every header it encodes or decodes, h2 and grpclib their frames
PROTOCOL_LOGGERS: Final = ("hpack", "h2", "grpclib", "hypercorn")


def quiet_protocol_loggers() -> None:
    """Cap :data:`PROTOCOL_LOGGERS` at INFO, whatever the root level, so that
    ``--log-level DEBUG`` never writes a bearer token or any other header value. Their
    warnings and errors still show."""
    for name in PROTOCOL_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), logging.INFO))


def configure_logging(level: str, log_format: str = "text") -> None:
    """The logging of ``python -m actorserve``: ``level``, ``log_format`` on stderr, the
    access lines batched in the same format. If the root logger has handlers already, they
    are kept (and the access lines go to them)."""
    from ..transport.access import ACCESS_LOGGER, AccessHandler  # the access log's writer

    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    ours = not logging.getLogger().handlers  # else basicConfig changes nothing: neither do we
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler])
    # hypercorn announces "Running on ..." itself; serve() says it once, with the playground
    logging.getLogger("hypercorn.error").setLevel(max(logging.getLogger().level, logging.WARNING))
    quiet_protocol_loggers()
    if ours:  # access lines: written a batch at a time, in the same format (transport/access.py)
        access = AccessHandler(sys.stderr, log_format)
        access.setFormatter(formatter)
        access_logger = logging.getLogger(ACCESS_LOGGER)
        access_logger.handlers[:] = [access]
        access_logger.propagate = False


__all__ = ["PROTOCOL_LOGGERS", "TEXT_FORMAT", "JsonFormatter", "configure_logging", "quiet_protocol_loggers"]
