"""gzip and deflate for both front doors: HTTP bodies and gRPC messages.

Pure functions on bytes (no I/O); the only place actorserve calls zlib. A caller that
compresses a large body off the event loop passes :func:`compress` to a worker thread.
"""

from __future__ import annotations

import zlib
from typing import Final

#: Encodings we read and write, with zlib's window bits for each.
WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}

#: The canonical names (``x-gzip`` is read as gzip).
ENCODINGS: Final = ("gzip", "deflate")

LEVEL: Final = 6


class TooLarge(Exception):
    """The data inflates to more than the limit (zip-bomb guard)."""


class BadEncoding(ValueError):
    """Unknown encoding, or data that is not valid for its encoding; the message says which."""


def normalise(encoding: str | None) -> str | None:
    """``None`` for identity (or no header), else the lower-case encoding name;
    :class:`BadEncoding` for one we do not support."""
    if encoding is None:
        return None
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return None
    if name not in WBITS:
        raise BadEncoding(f"unsupported encoding {encoding!r} (supported: identity, {', '.join(ENCODINGS)})")
    return name


def compress(data: bytes, encoding: str) -> bytes:
    """``data`` compressed as gzip or deflate (zlib-wrapped, as HTTP and gRPC mean it)."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, WBITS[encoding])
    return compressor.compress(data) + compressor.flush()


def decompress(data: bytes | memoryview, encoding: str, limit: int) -> bytes:
    """Inflate ``data``, refusing to produce more than ``limit`` bytes (:class:`TooLarge`);
    :class:`BadEncoding` if it is corrupt or truncated."""
    inflater = zlib.decompressobj(WBITS[encoding])
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadEncoding(f"not valid {encoding} data: {exc}") from None
    if len(out) > limit:
        raise TooLarge(f"{encoding} data inflates to more than {limit} bytes")
    if not inflater.eof:
        raise BadEncoding(f"truncated {encoding} data")
    return out


def accepts(accept_encoding: str | None, encoding: str = "gzip") -> bool:
    """Whether an ``Accept-Encoding`` header allows ``encoding`` (``gzip;q=0`` does not)."""
    if not accept_encoding:
        return False
    aliases = ("gzip", "x-gzip", "*") if encoding == "gzip" else (encoding, "*")
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() not in aliases:
            continue
        q = params.strip()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False
