"""Every gRPC example runs against a real server and exits 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from e2e.grpc_fixtures import GrpcServer, grpc_server

__all__ = ["grpc_server"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["grpc_client.py", "grpc_stream.py", "tritonclient_stream.py"])
async def test_example_runs(grpc_server: GrpcServer, name: str) -> None:
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, str(EXAMPLES / name), "--grpc", grpc_server.target],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, output
    await grpc_server.assert_quiet()
