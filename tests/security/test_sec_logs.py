"""Issue 19 on the real command line, in both process shapes (``--api-workers 0`` and a
front process before an engine process) at ``--log-level DEBUG`` with the access log on:

- finding 1 again, on the fronts of the multi-process shape: ``//``, absolute-form and
  h2c targets without a leading ``/`` are refused, nothing is unloaded;
- finding 5: the protocol libraries (hpack, h2, grpclib, hypercorn) never write a header
  value, so a bearer token sent over gRPC and h2c appears nowhere in the log;
- finding 9: a ``%0a`` in a path cannot forge a line of the text access log."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import tritonclient.grpc as grpcclient
from support.servers import ServerProcess, start_server

STARTUP = 60.0


class Debugged:
    def __init__(self, process: ServerProcess, parser: str, http: str, grpc: str, token: str) -> None:
        self.process, self.parser, self.http, self.grpc, self.token = process, parser, http, grpc, token

    @property
    def port(self) -> int:
        return int(self.http.rsplit(":", 1)[1])


@pytest.fixture(
    scope="module", params=[("0", "httptools"), ("1", "h11")], ids=["one-process", "front-and-engine"]
)
def debugged(request: pytest.FixtureRequest) -> Iterator[Debugged]:
    workers, parser = request.param
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        workers,
        "--http-parser",
        parser,
        "--log-level",
        "DEBUG",
        "--access-log",
    )
    try:
        if workers != "0":
            server.wait_for(rf"serving with {workers} front process", STARTUP)
        http = server.wait_for(r"REST listening on (http://\S+)", STARTUP)[1]
        grpc = server.wait_for(r"gRPC listening on (\S+)")[1]
        token_file = Path(server.wait_for(r"management token generated: .* token in (\S+)")[1])
        yield Debugged(server, parser, http, grpc, token_file.read_text().strip())
    finally:
        server.stop()


def raw_status(port: int, method: str, target: str) -> int:
    """Send one HTTP/1.1 request as given (``Connection: close``) and read its status."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def h2_status(port: int, path: str, token: str | None = None) -> str | None:
    """One raw h2c request (prior knowledge); its ``:status``, or None if it was reset."""
    import socket

    config = h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8", validate_outbound_headers=False
    )
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "t")]
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    conn.send_headers(1, headers, end_stream=True)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(conn.data_to_send())
        for _ in range(100):  # bounded: a handful of frames come back
            chunk = sock.recv(65536)
            if not chunk:
                return None
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    return dict(event.headers).get(":status")
                if isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                    return None
            sock.sendall(conn.data_to_send())
    return None


def test_non_canonical_targets_are_refused_on_every_front(debugged: Debugged) -> None:
    port = debugged.port
    assert raw_status(port, "POST", "//v2/repository/models/identity/unload") == 400
    assert raw_status(port, "POST", "http://t/v2/repository/models/identity/unload") == 400
    assert raw_status(port, "POST", "/v2/repository/models/identity/unload/") == 401
    assert raw_status(port, "POST", "/v2/./repository/models/identity/unload") == 400
    assert h2_status(port, "v2/repository/models/identity/unload") in ("400", None)
    assert h2_status(port, "/v2/repository/models/identity/unload") == "401"
    with httpx.Client(base_url=debugged.http, timeout=10) as client:
        assert client.get("/v2/models/identity/ready").status_code == 200  # nothing was unloaded


def test_a_websocket_handshake_is_refused_on_every_front(debugged: Debugged) -> None:
    import socket

    handshake = (
        b"GET /v2/repository/models/identity/unload HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", debugged.port), timeout=10) as sock:
        sock.sendall(handshake)
        status = int(sock.recv(65536).split(b" ", 2)[1])
    # h11 hands the app a WebSocket scope (refused unaccepted: 403); httptools answers plain HTTP
    assert status == (403 if debugged.parser == "h11" else 401)
    assert "Traceback" not in debugged.process.text()


def test_no_header_value_and_no_forged_line_is_logged(debugged: Debugged) -> None:
    """Runs last in this module: it stops the server to read the whole log."""
    port, token = debugged.port, debugged.token
    raw_status(port, "GET", "/v2/health/live%0a2026-01-01%20INFO%20actorserve.access:%20forged")
    # the token, over h2c (httpx with prior knowledge) and gRPC
    with httpx.Client(base_url=debugged.http, http1=False, http2=True, timeout=10) as client:
        described = client.get("/v2/repository/models/identity", headers={"Authorization": f"Bearer {token}"})
        assert (described.http_version, described.status_code) == ("HTTP/2", 200)
    with grpcclient.InferenceServerClient(debugged.grpc) as grpc:
        assert grpc.is_model_ready("identity", headers={"authorization": f"Bearer {token}"})
        index = grpc.get_model_repository_index(headers={"authorization": f"Bearer {token}"})
        assert "identity" in str(index)
    debugged.process.stop()  # the access log's last lines are flushed as it stops
    log = debugged.process.text()
    assert " DEBUG actorserve" in log  # the level really was DEBUG
    assert token not in log
    assert not re.search(r"^\S*\s*authorization", log, re.IGNORECASE | re.MULTILINE)
    # one access line for the request, its newline and spaces escaped; no line of its own
    forged = [line for line in log.splitlines() if "forged" in line]
    assert (
        len(forged) == 1 and "actorserve.access: rest GET /v2/health/live\\n2026-01-01\\x20INFO" in forged[0]
    ), forged
