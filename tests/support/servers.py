"""``python -m actorserve`` in a subprocess, its log read by a thread, for the tests that
need the real command line (examples, the multi-process server)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[2]


@attrs.define(eq=False)
class ServerProcess:
    """A running server; its stderr lines collect in ``log`` (so the pipe never fills)."""

    process: subprocess.Popen[bytes]
    log: list[str] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    reader: threading.Thread | None = None

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.log)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """The first match of ``pattern`` in the log; fails the test (with the log) if it
        does not appear within ``timeout`` s or the server exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match is not None:
                return match
            if self.process.poll() is not None and (self.reader is None or not self.reader.is_alive()):
                break
            time.sleep(0.05)
        pytest.fail(f"no {pattern!r} in the server's log:\n{self.text()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s; wait for the log to end."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.reader is not None:
            self.reader.join(timeout=5)

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            with self.lock:
                self.log.append(raw.decode(errors="replace").rstrip("\n"))


def start_server(*args: str, env: Mapping[str, str] | None = None) -> ServerProcess:
    """``python -m actorserve --host 127.0.0.1 --grace-period 2 ARGS`` from the project
    root, without the caller's ``ACTORSERVE_*`` variables (but with ``env``'s)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ACTORSERVE_")}, **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "actorserve", "--host", "127.0.0.1", "--grace-period", "2", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    server = ServerProcess(process)
    server.reader = threading.Thread(target=server._drain, daemon=True)
    server.reader.start()
    return server


@attrs.frozen
class Served:
    """A server of :func:`serving` and where it listens (``http``: a URL, ``grpc``: host:port)."""

    process: ServerProcess
    http: str
    grpc: str


def identity_folder(folder: Path) -> Path:
    """``folder`` holding one model folder, ``identity`` (the built-in identity model)."""
    (folder / "identity").mkdir()
    (folder / "identity" / "model-settings.json").write_text(
        json.dumps({"name": "identity", "implementation": "actorserve.models.identity.IdentityModel"})
    )
    return folder


@contextmanager
def serving(folder: Path, api_workers: int, *args: str, ready_within: float = 60) -> Iterator[Served]:
    """``python -m actorserve`` on ``folder`` (no auth, ports 0, ``api_workers`` fronts and
    ``args``), yielded once every front serves, stopped after."""
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        str(api_workers),
        "--no-auth",
        *args,
        str(folder),
    )
    try:
        server.wait_for(
            r"serving with 1 front process" if api_workers else r"REST listening on", ready_within
        )
        http = server.wait_for(r"REST listening on (http://\S+)")[1]
        grpc_address = server.wait_for(r"gRPC listening on (\S+)")[1]
        yield Served(server, http, grpc_address)
    finally:
        server.stop()
