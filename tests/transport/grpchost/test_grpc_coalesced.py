"""CoalescedWrites: what grpclib writes to a connection in one turn of the event loop
reaches the socket in one write, in order; closing writes what is pending first."""

from __future__ import annotations

import asyncio
from typing import Any

from actorserve.transport.grpchost.writes import CoalescedWrites


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def test_one_turn_is_one_write_in_order() -> None:
    async def main() -> Transport:
        transport = Transport()
        coalesced = CoalescedWrites(transport)
        coalesced.write(b"headers")
        coalesced.write(b"")
        coalesced.write(b"data")
        coalesced.write(b"trailers")
        assert transport.writes == []  # nothing until the loop runs its callbacks
        await asyncio.sleep(0)
        coalesced.write(b"next")
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # nothing pending: no empty write
        assert coalesced.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's
        return transport

    assert asyncio.run(main()).writes == [b"headersdatatrailers", b"next"]


def test_close_writes_what_is_pending_and_abort_drops_it() -> None:
    async def main() -> tuple[Transport, Transport]:
        closed, aborted = Transport(), Transport()
        for transport in (closed, aborted):
            coalesced = CoalescedWrites(transport)
            coalesced.write(b"goaway")
            coalesced.close() if transport is closed else coalesced.abort()
        await asyncio.sleep(0)  # the scheduled flush finds nothing (or a closed transport)
        return closed, aborted

    closed, aborted = asyncio.run(main())
    assert (closed.writes, closed.closed) == ([b"goaway"], True)
    assert (aborted.writes, aborted.aborted) == ([], True)
