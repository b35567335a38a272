"""The multi-process server and its model folders, as real processes on 127.0.0.1 port 0.

Issue 30, finding 6: a front that died was restarted by re-reading the model folders, so
a file broken by then stopped the whole server (exit 1, every sequence lost); and every
process extracted every ``.mar`` (four copies in the default shape). Finding 13: a front
killed with requests in flight left its count in ``actorserve_requests_in_flight`` for
good. Issue 33: an empty model store did not start (TorchServe's own flow starts on one
and registers later); a SIGTERM during a slow start-up waited for the last front to start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.servers import ROOT, ServerProcess, start_server

from actorserve.tempdirs import is_temp_folder

STARTUP_TIMEOUT = 60.0
HANDLER = b"def handle(data, context):\n    return ['seen ' + str(data[0]['body'])] if data else None\n"


def make_mar(path: Path) -> Path:
    manifest = {"model": {"modelName": path.stem, "handler": "handler.py", "modelVersion": "1.0"}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("handler.py", HANDLER)
    return path


def model_folder(store: Path, name: str, implementation: str, **more: object) -> Path:
    (store / name).mkdir(parents=True)
    settings = {"name": name, "implementation": implementation, **more}
    (store / name / "model-settings.json").write_text(json.dumps(settings))
    return store / name


def extractions(tmp: Path, stem: str) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if is_temp_folder(p, f"mar-{stem}"))


def front_pids(server: ServerProcess) -> dict[int, int]:
    """front index -> pid of its current process."""
    return {
        int(m[1]): int(m[2]) for m in re.finditer(r"front (\d+) process started \(pid (\d+)\)", server.text())
    }


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return " Z " not in (stat.read_text() if stat.exists() else "")


@pytest.fixture
def tmp() -> Path:
    """The servers' temporary folder (TMPDIR): where they extract archives. Short (in the
    session's, which pytest prunes): the engine's Unix socket path must fit 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="t", dir=tempfile.gettempdir()))


@contextlib.contextmanager
def serving(store: Path, tmp: Path, *args: str, api_workers: int = 2) -> Iterator[tuple[ServerProcess, str]]:
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--no-auth",
        "--api-workers",
        str(api_workers),
        *args,
        str(store),
        env={"TMPDIR": str(tmp)},
    )
    try:
        url = server.wait_for(r"REST listening on (http://\S+)", STARTUP_TIMEOUT)[1]
        yield server, url
    finally:
        server.stop()


def kill_front(server: ServerProcess, index: int) -> None:
    """SIGKILL front ``index`` and wait until the parent has started another."""
    victim = front_pids(server)[index]
    os.kill(victim, signal.SIGKILL)
    server.wait_for(rf"front {index} \(pid {victim}\) exited with code -9: restarting it")
    server.wait_for(rf"front {index} process started \(pid (?!{victim}\b)\d+\)", STARTUP_TIMEOUT)


def accumulate(url: str, value: int, **sequence: object) -> httpx.Response:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT64", "data": [value]}],
        "parameters": sequence,
    }
    with httpx.Client(base_url=url, timeout=20) as client:  # a new connection: any front
        return client.post("/v2/models/accumulator/infer", json=body)


def test_a_front_restarted_while_a_folder_is_broken_keeps_serving_and_extracts_nothing(
    tmp_path: Path, tmp: Path
) -> None:
    store = tmp_path / "store"
    model_folder(
        store,
        "accumulator",
        "actorserve.models.accumulator.AccumulatorModel",
        sequence={"idle_timeout_ms": 600_000},
    )
    make_mar(store / "seen.mar")
    with serving(store, tmp) as (server, url):
        server.wait_for(r"serving with 2 front process")
        assert len(extractions(tmp, "seen")) == 1  # one per server, not one per process
        opened = accumulate(url, 1, sequence_start=True)
        assert opened.status_code == 200, opened.text
        sequence_id = opened.headers["sequence-id"]
        (store / "accumulator" / "model-settings.json").write_text("{ broken")
        model_folder(store, "added", "no.such.Model")  # and a folder added meanwhile
        (store / "added" / "model-settings.json").write_text('{"name": ')
        kill_front(server, 1)
        kill_front(server, 2)
        total = 1
        for value in range(2, 8):
            reply = accumulate(url, value, sequence_id=sequence_id)
            total += value
            assert (reply.status_code, reply.json()["outputs"][0]["data"]) == (200, [total])
        with httpx.Client(base_url=url, timeout=20) as client:
            seen = client.post("/predictions/seen", content=b"x", headers={"Content-Type": "text/plain"})
        assert (seen.status_code, seen.text) == (200, "seen x")
        assert server.process.poll() is None
        assert len(extractions(tmp, "seen")) == 1


def in_flight_rest(url: str) -> float:
    with httpx.Client(base_url=url, timeout=20) as client:
        text = client.get("/metrics").text
    match = re.search(r'^actorserve_requests_in_flight\{transport="rest"\} (\S+)$', text, re.M)
    return float(match[1]) if match else 0.0


def test_a_killed_fronts_in_flight_requests_leave_the_gauge(tmp_path: Path, tmp: Path) -> None:
    store = tmp_path / "store"
    model_folder(store, "streamer", "actorserve.models.streamer.StreamerModel")
    with serving(store, tmp) as (server, url):
        server.wait_for(r"serving with 2 front process")
        idle = in_flight_rest(url)  # the scrape itself, perhaps

        def stream() -> None:  # cut when its front is killed
            body = {"text_input": "x", "parameters": {"n_tokens": 10_000, "delay": 0.05}}
            try:
                with (
                    httpx.Client(base_url=url, timeout=60) as client,
                    client.stream("POST", "/v2/models/streamer/generate_stream", json=body) as response,
                ):
                    for _ in response.iter_lines():
                        pass
            except httpx.HTTPError:
                pass

        streams = [threading.Thread(target=stream) for _ in range(4)]
        for thread in streams:
            thread.start()
        for _ in range(200):  # each front writes its count at most a second late
            if in_flight_rest(url) >= idle + 4:
                break
            threading.Event().wait(0.1)
        assert in_flight_rest(url) >= idle + 4
        kill_front(server, 1)
        kill_front(server, 2)
        for thread in streams:
            thread.join(timeout=30)
            assert not thread.is_alive()
        assert in_flight_rest(url) == idle


@pytest.mark.parametrize("api_workers", [0, 2])
def test_an_empty_model_store_starts_and_models_are_registered_later(
    tmp_path: Path, tmp: Path, api_workers: int
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    with serving(store, tmp, api_workers=api_workers) as (server, url):
        assert f"model folder {store} is empty" in server.text()
        with httpx.Client(base_url=url, timeout=20) as client:
            assert client.post("/v2/repository/index", json={}).json() == []
            make_mar(store / "seen.mar")
            registered = client.post("/models", params={"url": "seen.mar"})
            assert registered.status_code == 200, registered.text
            seen = client.post("/predictions/seen", content=b"y", headers={"Content-Type": "text/plain"})
            assert (seen.status_code, seen.text) == (200, "seen y")


SLOW_MODEL = """
import os
from pathlib import Path

import trio

from actorserve import Model


class SlowLoad(Model):
    async def load(self) -> None:
        Path(__file__).with_name("loading").write_text(str(os.getpid()))
        await trio.sleep(600)
"""


@pytest.mark.parametrize("api_workers", [2, 0])
def test_a_sigterm_during_start_up_stops_at_once(tmp_path: Path, tmp: Path, api_workers: int) -> None:
    """The parent used to wait for the engine's load, then start every front (which
    answered requests) before it stopped; now it stops the engine mid-load and starts
    no front. One process (``--api-workers 0``) used to watch the signals only once it
    served: a SIGTERM during the load ended it by the signal's default action (-15)."""
    store = tmp_path / "store"
    folder = model_folder(store, "slow", "slow.SlowLoad")
    (folder / "slow.py").write_text(SLOW_MODEL)
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--no-auth",
        "--api-workers",
        str(api_workers),
        str(store),
        env={"TMPDIR": str(tmp)},
    )
    try:
        for _ in range(600):  # bounded: the engine is loading the slow model
            if (folder / "loading").exists() and (folder / "loading").read_text():
                break
            threading.Event().wait(0.1)
        engine = int((folder / "loading").read_text())
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()
    assert "SIGTERM: shutting down gracefully" in server.text()
    assert "actorserve stopped" in server.text()
    assert front_pids(server) == {}  # no front ever served a request
    assert "REST listening" not in server.text()
    assert not running(engine)


NOTICES = """
import sys

import trio

import actorserve
from actorserve.server.logformat import configure_logging
from actorserve.torchserve import archive_settings

configure_logging(sys.argv[2])


async def main() -> None:
    async with actorserve.open_engine([archive_settings(sys.argv[1])]):
        print("loaded", flush=True)


trio.run(main)
"""

BASE_HANDLER = """
import os

from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import load_label_mapping


class Labelled(BaseHandler):
    def initialize(self, context):
        folder = context.system_properties.get("model_dir")
        self.mapping = load_label_mapping(os.path.join(folder, "index_to_name.json"))
        self.initialized = True

    def handle(self, data, context):
        return [len(data)]
"""


def test_a_base_handler_loads_without_torchserve_notices_as_warnings(tmp_path: Path) -> None:
    """Importing BaseHandler logged three WARNINGs for optional accelerators that are not
    installed and one for a missing label file: the whole log at ``--log-level warning``."""
    pytest.importorskip("ts")
    folder = tmp_path / "labelled"
    (folder / "MAR-INF").mkdir(parents=True)
    manifest = {"model": {"modelName": "labelled", "handler": "labelled.py"}}
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(manifest))
    (folder / "labelled.py").write_text(BASE_HANDLER)

    def load(level: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", NOTICES, str(folder), level],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert (done.returncode, done.stdout) == (0, "loaded\n"), done.stderr
        return done.stderr

    assert " ts." not in load("WARNING")
    info = load("INFO")
    assert re.search(r"INFO ts\.utils\.util: .*index_to_name\.json' is missing", info), info
    assert "OpenVINO" not in info  # DEBUG: which optional accelerator is not installed
