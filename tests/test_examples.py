"""Every ``examples/*.py`` runs against one real server and exits 0, so the examples
never rot; against a server that refuses it (no token, or a wrong one), each exits 1 with
one line saying how to pass the token, never a stack trace.

The server is ``python -m actorserve`` (built-in models, 127.0.0.1, port 0 for REST and
gRPC) in a subprocess shared by the module; its real addresses come from its log. Each
example runs as ``python examples/NAME.py --http URL [--grpc HOST:PORT]`` with a 60 s
limit. An example that needs gRPC while the gRPC transport cannot be imported is an
expected failure, and only then.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from support.servers import start_server

ROOT = Path(__file__).resolve().parents[1]
#: every example; example_token.py is the token handling they share, not an example of its own
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name != "example_token.py")
STARTUP_TIMEOUT = 60.0
EXAMPLE_TIMEOUT = 60.0


def grpc_import_error() -> ImportError | None:
    try:
        importlib.import_module("actorserve.transport.grpc")
    except ImportError as exc:
        return exc
    return None


@attrs.define
class RunningServer:
    process: subprocess.Popen[bytes]
    http_url: str
    grpc_target: str | None
    log: list[str]
    #: the management token the server generated (examples read it from ACTORSERVE_TOKEN)
    token: str


@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "api-workers-2"])
def running_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The server in one process, and as a parent with an engine process and two fronts:
    every example must work the same against both."""
    grpc_port = "off" if grpc_import_error() is not None else "0"
    server = start_server("--http-port", "0", "--grpc-port", grpc_port, "--api-workers", str(request.param))
    try:
        http = server.wait_for(r"REST listening on (http://\S+)", STARTUP_TIMEOUT)
        grpc = re.search(r"gRPC listening on (\S+:\d+)", server.text())
        token_file = server.wait_for(r"management token generated: .* token in (\S+)")[1]
        token = Path(token_file).read_text().strip()
        yield RunningServer(server.process, http[1], grpc[1] if grpc else None, server.log, token)
    finally:
        server.stop()


def _uses_grpc(source: str) -> bool:
    return (
        re.search(r"^\s*(from|import)\s+(grpclib|grpc\b|tritonclient\.grpc|actorserve\.proto)", source, re.M)
        is not None
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(running_server: RunningServer, example: Path) -> None:
    args = [sys.executable, str(example), "--http", running_server.http_url]
    if running_server.grpc_target is not None:
        args += ["--grpc", running_server.grpc_target]
    env = {**os.environ, "ACTORSERVE_TOKEN": running_server.token}
    result = subprocess.run(args, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT, cwd=ROOT, env=env)
    if result.returncode != 0:
        missing = grpc_import_error()
        if missing is not None and _uses_grpc(example.read_text()):
            pytest.xfail(f"needs gRPC, which cannot be imported here: {missing}")
    assert result.returncode == 0, f"{example.name} failed:\n{result.stdout}\n{result.stderr}"
    assert running_server.process.poll() is None, "the server died:\n" + "\n".join(running_server.log)


# -- a server that refuses: every example says why, in one line, without a stack trace --------

#: runs a server of its own (inference there needs no token): nothing can refuse it
OWN_SERVER = {"embed_in_trio.py"}


def assert_refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"the server refused .+ \((HTTP 401|UNAUTHENTICATED|unauthorized)\): it needs its bearer token\. Run with "
        r"ACTORSERVE_TOKEN=\$\(cat <the token file named in the server's log>\) \(see docs/security\.md\)",
        last,
    ), last


def test_manage_models_without_the_token_says_so(running_server: RunningServer) -> None:
    """Management needs the token by default; this example once died on KeyError: 'workers'."""
    args = [sys.executable, str(ROOT / "examples" / "manage_models.py"), "--http", running_server.http_url]
    env = {k: v for k, v in os.environ.items() if k != "ACTORSERVE_TOKEN"}
    result = subprocess.run(args, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT, cwd=ROOT, env=env)
    assert_refused(result)
    assert "POST /v2/repository/models/accumulator/workers (HTTP 401)" in result.stderr


@pytest.fixture(scope="module")
def refusing_server() -> Iterator[RunningServer]:
    """One process whose inference needs the token too (``--auth-inference``)."""
    grpc_port = "off" if grpc_import_error() is not None else "0"
    server = start_server(
        "--http-port", "0", "--grpc-port", grpc_port, "--api-workers", "0", "--auth-inference"
    )
    try:
        http = server.wait_for(r"REST listening on (http://\S+)", STARTUP_TIMEOUT)
        grpc = re.search(r"gRPC listening on (\S+:\d+)", server.text())
        yield RunningServer(server.process, http[1], grpc[1] if grpc else None, server.log, token="")
    finally:
        server.stop()


@pytest.mark.parametrize(
    "example", [p for p in EXAMPLES if p.name not in OWN_SERVER], ids=lambda p: str(p.name)
)
@pytest.mark.parametrize("token", ["", "wrong-token"], ids=["no-token", "wrong-token"])
def test_example_refused_says_how_to_pass_the_token(
    refusing_server: RunningServer, example: Path, token: str
) -> None:
    if refusing_server.grpc_target is None and _uses_grpc(example.read_text()):
        pytest.xfail(f"needs gRPC, which cannot be imported here: {grpc_import_error()}")
    args = [sys.executable, str(example), "--http", refusing_server.http_url]
    if refusing_server.grpc_target is not None:
        args += ["--grpc", refusing_server.grpc_target]
    env = {k: v for k, v in os.environ.items() if k != "ACTORSERVE_TOKEN"}
    if token:
        env["ACTORSERVE_TOKEN"] = token
    result = subprocess.run(args, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT, cwd=ROOT, env=env)
    assert_refused(result)
