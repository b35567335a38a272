"""Issue 19, finding 2 (the token's half): ``ACTORSERVE_TOKEN`` (or the token file's path)
does not stay in the environment of the processes that run model code. A model of a
model folder reports its ``os.environ`` at load and at inference; neither holds the token,
its value, nor a variable naming the token file or the descriptor the fronts read it from,
in both process shapes (``--api-workers 0`` and a parent with an engine and two fronts),
whether the token came from ``ACTORSERVE_TOKEN``, ``ACTORSERVE_TOKEN_FILE`` or was
generated; and the fronts still check it."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.servers import ServerProcess, start_server

from actorserve.server.tokens import TOKENS_FD_VAR, read_tokens, take_tokens, token_handoff
from actorserve.settings import Settings
from actorserve.transport.auth import Scope

STARTUP_TIMEOUT = 60.0
SECRET = "s3cret-token-of-the-test"

MODEL = """
import json
import os

from actorserve.model import Model


def environment() -> str:
    return json.dumps(dict(os.environ))


class EnvModel(Model):
    async def load(self) -> None:
        self.at_load = environment()

    async def predict(self, request):
        return self.response(request, [], {"at_load": self.at_load, "at_infer": environment()})
"""


def model_folder(root: Path) -> Path:
    folder = root / "models" / "envmodel"
    folder.mkdir(parents=True)
    (folder / "envmodel.py").write_text(MODEL)
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "envmodel", "implementation": "envmodel.EnvModel"})
    )
    return folder.parent


@pytest.fixture(params=[("variable", 0), ("variable", 2), ("file", 2), ("generated", 0), ("generated", 2)])
def running(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    """(server, its REST URL, the token it accepts) for one way of giving the token, in
    one process shape."""
    how, api_workers = request.param
    env: dict[str, str] = {}
    if how == "variable":
        env["ACTORSERVE_TOKEN"] = SECRET
    elif how == "file":
        (tmp_path / "tokens").write_text(f"# the test's\n{SECRET}\n")
        env["ACTORSERVE_TOKEN_FILE"] = str(tmp_path / "tokens")
    args = (
        "--http-port",
        "0",
        "--grpc-port",
        "off",
        "--api-workers",
        str(api_workers),
        str(model_folder(tmp_path)),
    )
    server = start_server(*args, env=env)
    try:
        url = server.wait_for(r"REST listening on (http://[0-9.:]+)", STARTUP_TIMEOUT)[1]
        token = SECRET
        if how == "generated":
            token = Path(server.wait_for(r"with the token in (\S+)")[1]).read_text().strip()
        yield server, url, token
    finally:
        server.stop()


def test_model_code_finds_no_token_in_its_environment(running: tuple[ServerProcess, str, str]) -> None:
    server, url, token = running
    with httpx.Client(base_url=url, timeout=30) as client:
        answer = client.post("/v2/models/envmodel/infer", json={"inputs": []})
        assert answer.status_code == 200, answer.text
        for moment in ("at_load", "at_infer"):
            environ = json.loads(answer.json()["parameters"][moment])
            assert environ, moment  # the model saw an environment (PATH, ...)
            assert [k for k in environ if re.search("TOKEN", k)] == [], moment
            assert [k for k, v in environ.items() if token in v] == [], moment
        # the processes that check tokens still have them (each front reads them from its parent)
        for _ in range(4):  # new connections: any front may answer
            with httpx.Client(base_url=url, timeout=30) as other:
                assert other.post("/v2/repository/models/envmodel/load").status_code == 401
                authorized = {"Authorization": f"Bearer {token}"}
                assert (
                    other.post("/v2/repository/models/envmodel/load", headers=authorized).status_code == 200
                )
    assert token not in server.text()  # nor in the log


def test_take_tokens_empties_the_environment_and_reads_the_handoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a server: what a front process does with its variables and descriptor; the
    handoff carries each token's scope (issue 30: an inference token stays one in a front)."""
    handoff = token_handoff(
        (("first", Scope.MANAGEMENT), ("second", Scope.MANAGEMENT), ("reader", Scope.INFERENCE))
    )
    assert handoff is not None
    with handoff:
        fds = [os.dup(handoff.fileno()) for _ in range(2)]  # two fronts: one open file, one offset
        os.lseek(fds[0], 0, os.SEEK_END)  # a position moved by anyone does not matter
        for fd in fds:
            monkeypatch.setenv("ACTORSERVE_TOKEN", "own")
            monkeypatch.setenv("ACTORSERVE_INFERENCE_TOKEN", "own-reader")
            monkeypatch.setenv("ACTORSERVE_TOKEN_FILE", "/nowhere")
            monkeypatch.setenv(TOKENS_FD_VAR, str(fd))
            token, inference = take_tokens(
                "ACTORSERVE_TOKEN", "ACTORSERVE_INFERENCE_TOKEN", "ACTORSERVE_TOKEN_FILE"
            )
            assert (token, inference) == ("own\nfirst\nsecond", "own-reader\nreader")
            assert read_tokens(Settings(token=token, inference_token=inference)) == (
                ("own", Scope.MANAGEMENT),
                ("first", Scope.MANAGEMENT),
                ("second", Scope.MANAGEMENT),
                ("own-reader", Scope.INFERENCE),
                ("reader", Scope.INFERENCE),
            )
            assert [k for k in os.environ if "TOKEN" in k] == []
            with pytest.raises(OSError):
                os.fstat(fd)  # closed
    assert token_handoff(()) is None
    assert take_tokens("ACTORSERVE_TOKEN", "ACTORSERVE_INFERENCE_TOKEN", "ACTORSERVE_TOKEN_FILE") == (
        None,
        None,
    )
