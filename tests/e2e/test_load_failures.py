"""A model that cannot load says why, wherever one looks: the load API's answer (REST and
gRPC), the repository index's ``reason``, one log line, and the CLI's exit message. Each
names the model, the file and line of the model's own code, and the underlying error
(type and message), never the trio ``ExceptionGroup`` it travelled in. A reload that
fails keeps the version loaded before serving (as Triton does) and says so in the index.

Both process shapes: ``serve`` in the test's nursery, and ``python -m actorserve`` with
two fronts and an engine process."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, rest_settings
from support.servers import ROOT, start_server
from tritonclient.utils import InferenceServerException

from actorserve.engine.repository import ModelRepository
from actorserve.server.composition import Server, serve

ECHO = """\
from actorserve import Model


class Echo(Model):
    async def predict(self, request):
        return self.response(request, [])
"""

RAISES_IN_LOAD = """\
from actorserve import Model


def read_weights():
    raise RuntimeError("weights file missing")


class Echo(Model):
    async def load(self):
        self.weights = read_weights()
"""

#: the model's code as each broken model has it, and what every place must say about it
BROKEN = {
    "raises": (
        RAISES_IN_LOAD,
        "loading model 'raises' failed: RuntimeError: weights file missing (raises/model.py, line 5, in read_weights)",
    ),
    "syntax": (
        "from actorserve import Model\n\nclass Echo(Model:\n    pass\n",
        "model 'syntax': cannot import 'model.Echo': SyntaxError: invalid syntax (syntax/model.py, line 3)",
    ),
    "imports": (
        "import numpy\nimport no_such_package_here\n",
        "model 'imports': cannot import 'model.Echo': ModuleNotFoundError: No module named 'no_such_package_here'"
        " (imports/model.py, line 2, in <module>)",
    ),
}


def write_model(root: Path, name: str, code: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps({"name": name, "implementation": "model.Echo"}))
    (folder / "model.py").write_text(code)
    return folder


def row(name: str, state: str, reason: str) -> dict[str, str]:
    return {"name": name, "version": "1", "state": state, "reason": reason}


def reload_note(message: str) -> str:
    return f"{message} (the version loaded before serves on)"


def scenario(http_url: str, grpc_address: str, root: Path) -> dict[str, Any]:
    """Load each broken model over REST and gRPC, then break ``echo`` (loaded at start)
    and load it again; what the server answered and listed (blocking: run in a thread)."""
    seen: dict[str, Any] = {}
    for name, (code, _) in BROKEN.items():
        write_model(root, name, code)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    with httpx.Client(base_url=http_url, timeout=TIMEOUT) as client:
        for name in BROKEN:
            answer = client.post(f"/v2/repository/models/{name}/load")
            seen[f"rest {name}"] = (answer.status_code, answer.json())
            try:
                grpc.load_model(name)
            except InferenceServerException as exc:
                seen[f"grpc {name}"] = (exc.status(), exc.message())
        (root / "echo" / "model.py").write_text(RAISES_IN_LOAD)
        answer = client.post("/v2/repository/models/echo/load")
        seen["rest reload"] = (answer.status_code, answer.json())
        seen["ready after reload"] = client.get("/v2/models/echo/ready").status_code
        seen["index"] = client.post("/v2/repository/index", json={}).json()
    grpc.close()
    return seen


def check(seen: dict[str, Any]) -> None:
    for name, (_, message) in BROKEN.items():
        assert seen[f"rest {name}"] == (400, {"error": message})
        assert seen[f"grpc {name}"] == ("StatusCode.INVALID_ARGUMENT", message)
        assert row(name, "UNAVAILABLE", message) in seen["index"]
    reload_failed = BROKEN["raises"][1].replace("'raises'", "'echo'").replace("raises/", "echo/")
    assert seen["rest reload"] == (400, {"error": reload_failed})
    assert seen["ready after reload"] == 200  # the version loaded before serves on
    assert row("echo", "READY", reload_note(reload_failed)) in seen["index"]


def expected_log_lines() -> list[str]:
    """The one line each failure logs (its traceback follows it)."""
    reload_failed = BROKEN["raises"][1].replace("'raises'", "'echo'").replace("raises/", "echo/")
    lines = [message for _, message in BROKEN.values() for _protocol in ("rest", "grpc")]
    return [*lines, reload_note(reload_failed)]


async def in_thread(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


async def test_load_failures_say_why_in_one_process(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, "echo", ECHO)
    repository = ModelRepository((tmp_path,))
    settings = rest_settings(models=tuple(repository.discover()), grpc_port=0)
    server: Server = await nursery.start(partial(serve, settings, repository=repository))
    assert server.grpc_address is not None
    host, port = server.grpc_address
    with caplog.at_level(logging.ERROR, logger="actorserve.engine"):
        seen = await in_thread(partial(scenario, str(server.http_url), f"{host}:{port}", tmp_path))
    check(seen)
    assert [r.getMessage() for r in caplog.records if r.name == "actorserve.engine"] == expected_log_lines()


def test_load_failures_say_why_with_fronts_and_an_engine(tmp_path: Path) -> None:
    write_model(tmp_path, "echo", ECHO)
    server = start_server(
        "--http-port", "0", "--grpc-port", "0", "--api-workers", "2", "--no-auth", str(tmp_path)
    )
    try:
        server.wait_for(r"serving with 2 front process", 60)
        http_url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        grpc_address = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        check(scenario(http_url, grpc_address, tmp_path))
        for line in expected_log_lines():
            server.wait_for(f"ERROR actorserve.engine: {re.escape(line)}\n", 10)
    finally:
        server.stop()


@pytest.mark.parametrize("api_workers", ["0", "2"])
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_model_that_cannot_load_at_start_says_why(tmp_path: Path, name: str, api_workers: str) -> None:
    code, message = BROKEN[name]
    folder = write_model(tmp_path, name, code)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "actorserve",
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "off",
            "--api-workers",
            api_workers,
            "--no-auth",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("actorserve: error: ")]
    assert errors == [f"actorserve: error: {folder / 'model-settings.json'}: {message}"], result.stderr
    assert result.returncode == (1 if name == "raises" else 2)
    assert f"ERROR actorserve.engine: {message}" in result.stderr
    assert "ExceptionGroup" not in result.stderr
