"""A connection surge: many clients connect at the same moment and each sends one
request on its own fresh connection (raw sockets, no pool), for the surge tests and
``benchmarks/reliability/surge.py``.

Every client ends in exactly one outcome: the HTTP status it got (``200``, ``429``,
``503`` ...), ``"reset"`` (the connection was refused, reset or closed with no answer)
or ``"timeout"`` (no answer within the bound).
"""

from __future__ import annotations

import collections
import select
import socket
import time
from collections.abc import Awaitable, Callable

import trio
import trio.lowlevel
import trio.testing

#: outcome of one client: an HTTP status, "reset" or "timeout"
Outcome = int | str


def generate_request(host: str, port: int, model: str = "streamer", body: bytes | None = None) -> bytes:
    """A complete HTTP/1.1 ``POST /v2/models/{model}/generate`` that closes its connection."""
    body = body if body is not None else b'{"text_input": "surge", "parameters": {"n_tokens": 2}}'
    path = f"/v2/models/{model}/generate"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def one_http_client(host: str, port: int, request: bytes, start: trio.Event, bound: float) -> Outcome:
    """Connect once ``start`` is set, send ``request``, read the status line."""
    await start.wait()
    with trio.move_on_after(bound):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return "reset"
        async with stream:
            return await status_of(stream, request)
    return "timeout"


async def status_of(stream: trio.abc.Stream, request: bytes) -> Outcome:
    """Send ``request`` on ``stream`` and read the status of the answer ("reset" if
    the connection ends first)."""
    try:
        await stream.send_all(request)
        head = b""
        while b"\r\n" not in head:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return "reset"
            head += chunk
        return int(head.split(b" ", 2)[1])
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, IndexError, ValueError):
        return "reset"


async def surge(
    clients: int, one: Callable[[trio.Event], Awaitable[Outcome]]
) -> collections.Counter[Outcome]:
    """Run ``clients`` calls of ``one(start)`` (an async function returning an
    :data:`Outcome`) released together by one event; count the outcomes."""
    outcomes: collections.Counter[Outcome] = collections.Counter()
    start = trio.Event()

    async def client() -> None:
        outcomes[await one(start)] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
        await trio.lowlevel.checkpoint()  # every client waits on the event
        await trio.testing.wait_all_tasks_blocked(0.01)
        start.set()
    return outcomes


async def http_surge(
    host: str, port: int, clients: int, *, model: str = "streamer", bound: float = 30.0
) -> collections.Counter[Outcome]:
    """``clients`` fresh connections, all at once, each one request; the outcomes."""
    request = generate_request(host, port, model)
    return await surge(clients, lambda start: one_http_client(host, port, request, start, bound))


def handshakes_within(host: str, port: int, count: int, window: float) -> tuple[int, list[socket.socket]]:
    """Start ``count`` non-blocking connects to ``port`` and return how many completed
    their TCP handshake within ``window`` seconds, and the sockets (the caller closes them).

    Synchronous on purpose: called from a trio task it also holds the server's event loop
    (when the server runs in the same process), so nothing accepts meanwhile and only the
    listen backlog decides. A handshake the full backlog dropped is retried by the
    kernel after 1 s, so it cannot complete within a window below that."""
    socks = connect_all(host, port, count, window)
    return sum(1 for _, done in socks if done), [sock for sock, _ in socks]


def connect_all(host: str, port: int, count: int, window: float) -> list[tuple[socket.socket, bool]]:
    """Start ``count`` non-blocking connects to ``port``: each socket, and whether its
    handshake completed within ``window`` seconds (see :func:`handshakes_within`)."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex((host, port))
        socks.append(sock)
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLOUT)
    done: set[int] = set()
    deadline = time.monotonic() + window
    while len(done) < count and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            done.add(fd)
            poller.unregister(fd)
    return [
        (sock, sock.fileno() in done and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
        for sock in socks
    ]


async def answers_on(
    socks: list[socket.socket], request: bytes, bound: float = 30.0
) -> collections.Counter[Outcome]:
    """Send ``request`` on each connected socket (taking them over: they are closed
    here) and count the status lines that come back."""
    outcomes: collections.Counter[Outcome] = collections.Counter()

    async def one(sock: socket.socket) -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        outcome: Outcome = "timeout"
        async with stream:
            with trio.move_on_after(bound):
                outcome = await status_of(stream, request)
        outcomes[outcome] += 1

    async with trio.open_nursery() as nursery:
        for sock in socks:
            nursery.start_soon(one, sock)
    return outcomes
