"""``python -m actorserve`` in a subprocess for the soak scenarios (shutdown, process
faults, surge, model faults): 127.0.0.1, port 0, only the ``streamer`` model (or the model
folders given), its log collected by a thread; the addresses and pids read from the log."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Served:
    """A running server (stop it with :meth:`stop`)."""

    def __init__(self, workers: int, *args: str, startup: float = 120.0, models: Path | None = None) -> None:
        self.workers = workers
        self._folder = tempfile.TemporaryDirectory(prefix="actorserve-soak-")
        if models is None:
            models = Path(self._folder.name)
            (models / "streamer").mkdir()
            (models / "streamer" / "model-settings.json").write_text(
                json.dumps({"name": "streamer", "implementation": "actorserve.models.streamer.StreamerModel"})
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORSERVE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "actorserve",
                "--host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
                "--api-workers",
                str(workers),
                "--no-auth",
                *args,
                str(models),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for(r"serving with \d+ front process" if workers else r"REST listening on", startup)
        self.http_port = int(self.wait_for(r"REST listening on http://127\.0\.0\.1:(\d+)")[1])
        self.grpc_port = int(self.wait_for(r"gRPC listening on 127\.0\.0\.1:(\d+)")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _read(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match is not None:
                return match
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise RuntimeError(f"no {pattern!r} in the server's log:\n{self.text()[-3000:]}")

    def fronts(self) -> dict[int, int]:
        """front index -> pid of its current process."""
        return {
            int(i): int(p) for i, p in re.findall(r"front (\d+) process started \(pid (\d+)\)", self.text())
        }

    def engine_pid(self) -> int:
        return int(self.wait_for(r"engine process started \(pid (\d+)\)")[1])

    def count(self, pattern: str) -> int:
        """How many times ``pattern`` is in the log so far."""
        return len(re.findall(pattern, self.text()))

    def rss_mib(self) -> float:
        """Resident memory of the engine process (the one process with no fronts), MiB."""
        pid = self.engine_pid() if self.workers else self.process.pid
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def serving_pids(self) -> list[int]:
        """The processes that accept connections: the fronts, or the one process."""
        return list(self.fronts().values()) if self.workers else [self.process.pid]

    def pause(self) -> None:
        for pid in self.serving_pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self.serving_pids():
            os.kill(pid, signal.SIGCONT)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        self._folder.cleanup()
        return int(self.process.returncode)
