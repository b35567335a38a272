"""One socket write per connection per turn of the event loop, for grpclib (which
writes to its transport after every HTTP/2 action: a unary call's headers, DATA and
trailers, each stream's batches, went out in separate ``send`` calls). Installed on
every connection by :class:`.h2.GrpclibServer`."""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescedWrites:
    """A connection's transport as grpclib sees it: :meth:`write` appends to a buffer,
    written in one ``transport.write`` when the event loop next runs callbacks (so at
    the end of the current turn, after every handler that ran in it). Closing writes
    what is pending first, as the transport itself would; aborting drops it. The rest
    (``is_closing``, ``get_extra_info``, flow control) is the transport's own."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self.transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


__all__ = ["CoalescedWrites"]
