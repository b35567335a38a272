"""Streams on reused keep-alive connections outlive the keep-alive timeout (issue 35).

The scenario that cut them: 8 clients, each on its own kept-alive HTTP/1.1 connection,
stream answers longer than ``--keep-alive-timeout`` back to back; the streams end
together, so every client's next request reaches the server at the instant the response
before it on the same connection ends. The connection's idle timer took the next
request's "busy" before the previous response's "idle" now and then, and the timeout
then closed the connection in the middle of the next stream (the client saw it cut
without its last chunk). Here the timeout is 0.3 s, each stream 0.5 s (5 tokens of the
built-in ``streamer``, 0.1 s apart), 5 rounds; every stream must arrive whole, on both
HTTP/1.1 parsers and on h2c (HTTP/2 by prior knowledge, a connection per client).

The server runs in its own process and each client in a thread, so that a client reads
its stream's end and sends its next request while the server is still ending that
stream, as separate client processes do (as tasks of one trio loop, the clients cut
nothing in 6 runs on the old code). Nothing here asserts a duration; the deterministic
schedules of the same race are in ``tests/transport/rest/test_idle_timer.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import attrs
import httpx
import pytest
from support.servers import ServerProcess, start_server

CLIENTS = 8
ROUNDS = 5
TOKENS = 5
#: seconds between tokens: a stream lasts TOKENS * DELAY = 0.5 s
DELAY = 0.1
#: the server's keep-alive timeout, shorter than a stream
KEEP_ALIVE = 0.3
#: bound on every wait (the run takes about ROUNDS * TOKENS * DELAY = 2.5 s)
TIMEOUT = 60.0

BODY = json.dumps(
    {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}],
        "parameters": {"n_tokens": TOKENS, "delay": DELAY},
    }
).encode()


@attrs.frozen
class Target:
    url: str
    #: "1.1", or "h2c" (HTTP/2 by prior knowledge, one connection per client too)
    http: str


@pytest.fixture(
    params=[("httptools", "1.1"), ("h11", "1.1"), ("httptools", "h2c")], ids=lambda p: "-".join(p)
)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A server with ``--http-parser`` and the HTTP version its clients speak."""
    parser, http = request.param
    server: ServerProcess = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--api-workers",
        "0",
        "--no-auth",
        "--keep-alive-timeout",
        str(KEEP_ALIVE),
        "--http-parser",
        parser,
    )
    try:
        yield Target(server.wait_for(r"REST listening on (http://\S+)", 60)[1], http)
    finally:
        server.stop()


def tokens_of(text: str) -> list[str]:
    """The ``text_output`` of each SSE event of a streamer answer, in order."""
    out = []
    for line in text.splitlines():
        if line.startswith("data:"):
            outputs = {o["name"]: o["data"] for o in json.loads(line[5:])["outputs"]}
            out.append(outputs["text_output"][0])
    return out


def test_back_to_back_streams_longer_than_the_keep_alive_timeout_arrive_whole(target: Target) -> None:
    expected = [f"hi:{k}" for k in range(TOKENS)]
    answers: dict[tuple[int, int], list[str] | str] = {}
    connections: set[int] = set()  # the local ports the clients used
    start = threading.Barrier(CLIENTS, timeout=TIMEOUT)

    def client(i: int) -> None:
        # one kept-alive connection per client, reused for every round
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        h2c = target.http == "h2c"
        with httpx.Client(
            base_url=target.url, limits=limits, timeout=TIMEOUT, http1=not h2c, http2=h2c
        ) as http:
            start.wait()  # every client's first stream at once: they all end together
            for r in range(ROUNDS):
                try:
                    with http.stream("POST", "/v2/models/streamer/infer_stream", content=BODY) as reply:
                        stream = reply.extensions["network_stream"]
                        connections.add(stream.get_extra_info("client_addr")[1])
                        text = reply.read().decode()
                    assert reply.http_version == ("HTTP/2" if h2c else "HTTP/1.1")
                    answers[i, r] = (
                        tokens_of(text) if reply.status_code == 200 else f"status {reply.status_code}"
                    )
                except httpx.HTTPError as error:  # a cut stream: the peer closed mid-body
                    answers[i, r] = repr(error)

    # threads, not tasks of one loop: each client reads its stream's end and sends its
    # next request at once, as separate client processes do
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)  # every wait is bounded by the clients' own timeouts too
    assert not any(thread.is_alive() for thread in threads)
    cut = {key: answer for key, answer in answers.items() if answer != expected}
    assert cut == {}
    assert len(answers) == CLIENTS * ROUNDS
    assert len(connections) == CLIENTS  # each client kept its one connection throughout
