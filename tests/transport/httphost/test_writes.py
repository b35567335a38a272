"""A connection's writes (``transport/httphost/writes.py``) on real loopback sockets: bytes
that fit go straight into the socket with no scheduler trip, the rest waits in
hypercorn's ``send_all`` (backpressure) with later writes behind it in order, a broken or
closed socket goes by ``send_all``, and a write is still a cancellation point."""

from __future__ import annotations

import socket as stdlib_socket
import ssl
from typing import Any

import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.events import Event, RawData
from hypercorn.trio.tcp_server import TCPServer

from actorserve.transport.httphost.writes import YIELD_EVERY, DirectWriter, plain_socket


class Recorder:
    """hypercorn's ``send``: records what went that way and sends it by ``send_all``
    under a lock, as ``TCPServer.protocol_send`` does."""

    def __init__(self, stream: trio.SocketStream | None = None) -> None:
        self.stream = stream
        self.lock = trio.Lock()
        self.sent: list[bytes] = []
        self.closed = False

    async def __call__(self, event: Event) -> None:
        assert isinstance(event, RawData)
        self.sent.append(event.data)
        if self.stream is not None:
            async with self.lock:
                try:
                    await self.stream.send_all(event.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.closed = True  # hypercorn: the protocol handles Closed()
        else:
            await trio.lowlevel.checkpoint()


async def tcp_pair() -> tuple[trio.socket.SocketType, trio.socket.SocketType]:
    """A connected pair of loopback TCP sockets (the server's end first)."""
    with trio.socket.socket() as listener:
        await listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = trio.socket.socket()
        await client.connect(listener.getsockname())
        server, _ = await listener.accept()
    return server, client


async def receive_all(sock: trio.socket.SocketType, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = await sock.recv(65536)
        assert chunk, f"closed after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


async def test_bytes_that_fit_go_straight_into_the_socket() -> None:
    ours, theirs = await tcp_pair()
    with ours, theirs:
        send = Recorder(trio.SocketStream(ours))
        writer = DirectWriter(send, ours)
        for i in range(10):
            await writer.write(b"event %d\n" % i)
        expected = b"".join(b"event %d\n" % i for i in range(10))
        assert await receive_all(theirs, len(expected)) == expected
        assert send.sent == []  # never through send_all


async def test_a_full_socket_waits_in_send_all_and_later_writes_queue_behind() -> None:
    ours, theirs = await tcp_pair()
    with ours, theirs:
        ours.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_SNDBUF, 4096)
        send = Recorder(trio.SocketStream(ours))
        writer = DirectWriter(send, ours)
        big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket holds
        done: list[str] = []

        async def write(name: str, data: bytes) -> None:
            await writer.write(data)
            done.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, "big", big)
            await trio.testing.wait_all_tasks_blocked()
            assert done == []  # backpressure: the client has read nothing
            nursery.start_soon(write, "tail", b"tail")
            await trio.testing.wait_all_tasks_blocked()
            assert await receive_all(theirs, len(big) + 4) == big + b"tail"
        assert done == ["big", "tail"]
        assert send.sent[-1] == b"tail"  # behind the rest of big, not straight in
        assert 0 < len(send.sent[0]) < len(big)  # the kernel took the first part directly


async def test_a_closed_socket_goes_by_send_all() -> None:
    ours, theirs = await tcp_pair()
    theirs.close()
    ours.close()
    send = Recorder()
    await DirectWriter(send, ours).write(b"late")
    assert send.sent == [b"late"]  # where hypercorn turns the error into Closed


async def test_a_reset_connection_goes_by_send_all() -> None:
    ours, theirs = await tcp_pair()
    with ours:
        theirs.close()
        send = Recorder(trio.SocketStream(ours))
        writer = DirectWriter(send, ours)
        for _ in range(50):  # the first write may still be taken; a later one meets the reset
            await writer.write(b"x" * 100)
            if send.closed:
                break
            await trio.lowlevel.checkpoint()
        assert send.closed  # the error went where hypercorn handles it, not to the producer


async def test_without_a_socket_every_write_goes_by_send_all() -> None:
    send = Recorder()
    await DirectWriter(send, None).write(b"tls")
    assert send.sent == [b"tls"]


async def test_a_cancelled_writer_writes_nothing() -> None:
    ours, theirs = await tcp_pair()
    with ours, theirs:
        writer = DirectWriter(Recorder(trio.SocketStream(ours)), ours)
        with trio.CancelScope() as scope:
            scope.cancel()
            await writer.write(b"never")
            pytest.fail("the write should have been cancelled")
        await writer.write(b"after")
        assert await receive_all(theirs, 5) == b"after"


async def test_a_producer_that_never_blocks_still_lets_others_run() -> None:
    ours, theirs = await tcp_pair()
    with ours, theirs:
        writer = DirectWriter(Recorder(trio.SocketStream(ours)), ours)
        turns = 0

        async def other() -> None:
            nonlocal turns
            while True:
                turns += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()  # (other never blocks: no wait_all_tasks_blocked)
            before = turns
            for _ in range(10 * YIELD_EVERY):
                await writer.write(b".")
            assert turns - before >= 9  # about one turn per YIELD_EVERY writes
            nursery.cancel_scope.cancel()
        assert await receive_all(theirs, 10 * YIELD_EVERY) == b"." * (10 * YIELD_EVERY)


async def test_the_socket_is_found_under_hypercorns_server() -> None:
    ours, theirs = await tcp_pair()
    with ours, theirs:
        stream = trio.SocketStream(ours)
        server: Any = TCPServer(None, Config(), None, None, stream)  # type: ignore[arg-type]
        assert plain_socket(server.protocol_send) is ours
        assert plain_socket(Recorder()) is None  # not hypercorn's server: send_all only
        tls_stream = trio.SSLStream(stream, ssl.create_default_context())
        tls: Any = TCPServer(None, Config(), None, None, tls_stream)  # type: ignore[arg-type]
        assert plain_socket(tls.protocol_send) is None  # TLS: the bytes must go through the SSL stream
