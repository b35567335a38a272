"""gRPC's length-prefixed message framing, for tests that read and write raw HTTP/2."""

from __future__ import annotations

import struct

_PREFIX = struct.Struct(">?I")


def frame(payload: bytes, compressed: bool = False) -> bytes:
    """One message: the compressed flag, the 4-byte big-endian length, the payload."""
    return _PREFIX.pack(compressed, len(payload)) + payload


def unframe(data: bytes) -> list[tuple[bool, bytes]]:
    """Every (compressed, payload) in ``data``, a run of whole messages."""
    out = []
    while data:
        compressed, size = _PREFIX.unpack(data[:5])
        out.append((compressed, data[5 : 5 + size]))
        data = data[5 + size :]
    return out
