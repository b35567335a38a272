"""Connection surge (issue 14): many clients connect at the same moment.

The listen backlog decides what happens to connections the server has not accepted
yet: hypercorn's and grpclib's default of 100 (and our old 128) made the kernel drop the
handshakes of a surge beyond it (the clients retry after 1 s, 3 s, ...; a client with a
short connect timeout, or a kernel with ``tcp_abort_on_overflow``, sees a failure).
Every listening port now queues ``--backlog`` (default 2048) connections.

The deterministic check: hold the server still (its event loop, or its front
processes), start 300 connects per port, count the handshakes done within 0.5 s (a
dropped one cannot: its retry is 1 s later), then let the server go and check every
REST client gets an answer. Plus a real surge of 600 clients, every one answered.
"""

from __future__ import annotations

import os
import re
import resource
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from support.rel_surge import answers_on, generate_request, handshakes_within, http_surge
from support.servers import ServerProcess, start_server

from actorserve.addresses import PORTS
from actorserve.models import builtin_settings
from actorserve.server.composition import Server, serve
from actorserve.server.listeners import effective_backlog, raise_open_file_limit
from actorserve.settings import Settings

#: connects per port: above the old backlogs (100 / 128), below the new default
SURGE = 300
WINDOW = 0.5


def _settings(**changes: object) -> Settings:
    light = tuple(m for m in builtin_settings() if m.name == "streamer")
    values: dict[str, object] = {
        "host": "127.0.0.1",
        "http_port": 0,
        "grpc_port": 0,
        "ts_inference_grpc_port": 0,
        "ts_management_grpc_port": 0,
        "ts_management_http_port": 0,
        "models": light,
        "no_auth": True,
    }
    values.update(changes)
    return Settings(**values)  # type: ignore[arg-type]


def test_the_backlog_is_a_setting_with_a_surge_sized_default() -> None:
    assert Settings().backlog == 2048
    assert effective_backlog(2048) <= 2048
    with pytest.raises(ValueError, match="backlog must be >= 1"):
        Settings(backlog=0)


async def test_every_port_of_one_process_queues_a_surge(nursery: trio.Nursery) -> None:
    raise_open_file_limit()  # 5 ports x 300 sockets, in this process
    server: Server = await nursery.start(partial(serve, _settings()))
    addresses = {"http": server.http_address, "grpc": server.grpc_address, **server.extra_addresses}
    assert sorted(addresses) == sorted(PORTS)
    held = {}
    for name, address in addresses.items():
        assert address is not None
        # the event loop is held here: nothing accepts, the backlog alone queues
        held[name] = handshakes_within(address[0], address[1], SURGE, WINDOW)
    assert {name: done for name, (done, _) in held.items()} == {name: SURGE for name in PORTS}
    for name, (_, socks) in held.items():
        if name != "http":
            for sock in socks:
                sock.close()
    assert server.http_address is not None
    request = generate_request(*server.http_address)
    assert await answers_on(held["http"][1], request) == {200: SURGE}


def _open_files_limits(pid: int) -> tuple[int, int]:
    (line,) = [
        line
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
        if line.startswith("Max open files")
    ]
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


@pytest.fixture
def two_fronts() -> Iterator[ServerProcess]:
    """Started with a soft open-file limit of 1,024 (inherited), which it must raise."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        server = start_server("--http-port", "0", "--grpc-port", "0", "--api-workers", "2", "--no-auth")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        server.wait_for(r"serving with 2 front process", 60)
        yield server
    finally:
        server.stop()


async def test_two_fronts_queue_a_surge_on_rest_and_grpc_and_answer_every_client(
    two_fronts: ServerProcess,
) -> None:
    """grpclib listens again on the socket a front inherits (its default backlog 100
    shrank the shared socket's queue): the fronts are stopped, the ports must still
    queue the whole surge."""
    http_port = int(two_fronts.wait_for(r"processes: REST listening on http://127\.0\.0\.1:(\d+)")[1])
    grpc_port = int(two_fronts.wait_for(r"processes: gRPC listening on 127\.0\.0\.1:(\d+)")[1])
    fronts = [int(pid) for pid in re.findall(r"front \d process started \(pid (\d+)\)", two_fronts.text())]
    assert len(fronts) == 2
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for pid in (two_fronts.process.pid, *fronts):  # raised at start, in every process
        assert _open_files_limits(pid) == (hard, hard)
    for pid in fronts:
        os.kill(pid, signal.SIGSTOP)
    try:
        rest_done, rest_socks = handshakes_within("127.0.0.1", http_port, SURGE, WINDOW)
        grpc_done, grpc_socks = handshakes_within("127.0.0.1", grpc_port, SURGE, WINDOW)
    finally:
        for pid in fronts:
            os.kill(pid, signal.SIGCONT)
    for sock in grpc_socks:
        sock.close()
    assert (rest_done, grpc_done) == (SURGE, SURGE)
    assert await answers_on(rest_socks, generate_request("127.0.0.1", http_port)) == {200: SURGE}
    # and a real surge, nothing held: every client answered
    assert await http_surge("127.0.0.1", http_port, 600) == {200: 600}
