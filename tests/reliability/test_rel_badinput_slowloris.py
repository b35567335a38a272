"""Bad input (issue 14): slow-loris clients. A connection that sends nothing, or its
request head byte by byte, is closed after ``keep_alive_timeout``; a body that trickles
in is answered 408 after ``read_timeout`` (then the connection is closed) on every route
family, with both HTTP/1.1 parsers. None of them holds a batch slot or starts model work
(the engine's statistics show nothing in flight, waiting or stepped while they trickle),
and other clients are served meanwhile.

Real sockets need real time: the timeouts are 0.3 s here (``--keep-alive-timeout`` and
``--read-timeout``), and every wait is bounded."""

from __future__ import annotations

import json

import pytest
import trio
from support.rel_badinput import Answer, launch, parse_answer

from actorserve.server.composition import Server

TIMEOUT = 0.3
#: how long a slow client keeps trickling if nobody stops it: far past the timeouts
TRICKLE_FOR = 3.0
BOUND = 5.0

INFER_BODY = json.dumps(
    {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}],
        "parameters": {"n_tokens": 2},
    }
).encode()
COMPLETION_BODY = json.dumps({"model": "streamer", "prompt": "hello", "max_tokens": 2}).encode()

#: (path, body, error format) of each route family that reads a body
ROUTES = (
    ("/v2/models/streamer/infer", INFER_BODY, "oip"),
    ("/v2/models/streamer/generate_stream", INFER_BODY, "oip"),
    ("/v1/completions", COMPLETION_BODY, "openai"),
    ("/predictions/streamer", b"hello there, slowly", "torchserve"),
    ("/v2/repository/index", b'{"ready": true}', "quart"),
)


async def trickle(
    port: int, data: bytes, *, head_bytes: int = 0, every: float = 0.05
) -> tuple[Answer, float]:
    """Send the first ``head_bytes`` at once, then the rest one byte every ``every`` s
    (for at most :data:`TRICKLE_FOR`); return what the server answered and when (s) it
    closed the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = bytearray()
    start = trio.current_time()
    closed_at = float("inf")

    async def read(cancel: trio.CancelScope) -> None:
        nonlocal closed_at
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                chunk = b""
            if not chunk:
                closed_at = trio.current_time() - start
                cancel.cancel()
                return
            received.extend(chunk)

    async with stream:
        with trio.move_on_after(BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read, nursery.cancel_scope)
                try:
                    await stream.send_all(data[:head_bytes])
                    for k in range(head_bytes, len(data)):
                        if trio.current_time() - start > TRICKLE_FOR:
                            break
                        await trio.sleep(every)
                        await stream.send_all(data[k : k + 1])
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the server closed it: read() sees the EOF
                await trio.sleep_forever()
    return parse_answer(bytes(received), closed_at < BOUND), closed_at


def post(path: str, body: bytes) -> tuple[bytes, bytes]:
    head = f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode(), body


def message_of(answer: Answer, style: str) -> str:
    document = json.loads(answer.body)
    if style == "openai":
        return str(document["error"]["message"])
    if style == "torchserve":
        assert (document["code"], document["type"]) == (408, "RequestTimeoutException")
        return str(document["message"])
    return str(document["error"])


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_slow_clients_time_out_without_model_work(nursery: trio.Nursery, parser: str) -> None:
    server = await launch(nursery, http_parser=parser, keep_alive_timeout=TIMEOUT, read_timeout=TIMEOUT)
    assert server.http_address is not None
    port = server.http_address[1]
    engine = server.engine
    before = await requests_seen(server)
    results: dict[str, tuple[Answer, float]] = {}
    during: list[tuple[int, int, int]] = []

    async def run(name: str, data: bytes, head_bytes: int) -> None:
        results[name] = await trickle(port, data, head_bytes=head_bytes)

    async with trio.open_nursery() as clients:
        clients.start_soon(run, "silent", b"", 0)
        clients.start_soon(run, "slow head", b"".join(post(*ROUTES[0][:2])), 0)
        for path, body, _ in ROUTES:
            head, rest = post(path, body)
            clients.start_soon(run, path, head + rest, len(head))
        # while they trickle: nothing in the engine, and another client is served
        await trio.sleep(TIMEOUT / 2)
        stats = await engine.statistics("streamer", "")
        during.append((stats.inflight, stats.waiting, stats.running))
        with trio.fail_after(BOUND):
            answer = await send_request(port, *post(*ROUTES[0][:2]))
        assert answer.status == 200, answer
    assert during == [(0, 0, 0)]
    # only the one good request reached a model (the engine's Triton statistics)
    assert await requests_seen(server) - before == 1

    silent, silent_at = results.pop("silent")
    slow_head, head_at = results.pop("slow head")
    assert (silent.status, silent.body, silent.closed) == (0, b"", True)
    assert (slow_head.status, slow_head.closed) == (0, True)
    assert silent_at < 2.0 and head_at < 2.0  # keep_alive_timeout, not the 3 s of trickle
    for path, _, style in ROUTES:
        answer, closed_at = results[path]
        assert (path, answer.status, answer.closed) == (path, 408, True)
        assert closed_at < 2.0, (path, closed_at)
        if style != "quart":
            assert message_of(answer, style) == "the request body did not arrive within 0.3 s (read_timeout)"
        else:
            assert json.loads(answer.body) == {"error": json.loads(answer.body)["error"]}


async def requests_seen(server: Server) -> int:
    """Requests any model was asked for (answered well or not)."""
    stats = await server.engine.inference_statistics()
    return sum(s.success.count + s.fail.count for s in stats)


async def send_request(port: int, head: bytes, body: bytes) -> Answer:
    """A whole request at once on a new connection (``connection: close``)."""
    head = head.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    async with stream:
        await stream.send_all(head + body)
        while chunk := await stream.receive_some(65536):
            data += chunk
    return parse_answer(data, True)
