"""Log line formats of ``python -m actorserve``: text (the default) and JSON
(``--log-format json``: one object a line, for log collectors).

A JSON line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus
``exception`` when there is one; an access line (logger ``actorserve.access``) adds its
fields (``transport``, ``method``, ``route``, ``status``, ...) as keys of its own.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Final

import orjson

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
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


__all__ = ["TEXT_FORMAT", "JsonFormatter"]
