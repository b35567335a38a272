"""Where a generated management token lives (actorserve/server/tokens.py): a stable path for a
fixed port, so ``$(cat ...)`` keeps working across restarts, private to this user; a
fresh temporary folder when the port is picked at start or the stable folder is unsafe."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from actorserve.server.tokens import remove_token_file, with_token
from actorserve.settings import Settings
from actorserve.tempdirs import is_temp_folder


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_token_file_of_a_fixed_port_stays_where_it_was(
    runtime: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "actorserve.server.tokens")
    settings, path = with_token(Settings(http_port=8080))
    assert path == runtime / "actorserve" / "8080" / "token"
    assert settings.token_file == str(path)
    assert (mode(path), mode(path.parent), mode(path.parent.parent)) == (0o600, 0o700, 0o700)
    first = path.read_text()
    assert caplog.text.count(str(path)) == 1 and first.strip() not in caplog.text
    remove_token_file(path)
    assert not path.exists() and path.parent.is_dir()  # the folder stays for the next start
    # the next start (or one after a killed server left its file): same path, new token
    path.write_text("stale\n")
    _, again = with_token(Settings(http_port=8080))
    assert again == path and again.read_text() not in (first, "stale\n")
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no leftovers
    assert with_token(Settings(http_port=8090))[1] == runtime / "actorserve" / "8090" / "token"


def test_a_picked_port_or_no_auth_gets_no_stable_file(runtime: Path) -> None:
    _, picked = with_token(Settings(http_port=0, grpc_port=0))
    assert picked is not None and is_temp_folder(picked.parent, "auth")
    remove_token_file(picked)
    assert not picked.parent.exists()
    assert with_token(Settings(http_port=8080, no_auth=True)) == (
        Settings(http_port=8080, no_auth=True),
        None,
    )
    assert not (runtime / "actorserve").exists()


def test_a_folder_open_to_others_is_not_used(runtime: Path, caplog: pytest.LogCaptureFixture) -> None:
    (runtime / "actorserve").mkdir(mode=0o755)
    (runtime / "actorserve").chmod(0o755)
    _, path = with_token(Settings(http_port=8080))
    assert path is not None and is_temp_folder(path.parent, "auth")
    assert "is not private to this user" in caplog.text
    remove_token_file(path)


def test_without_a_runtime_folder_it_is_under_the_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    _, path = with_token(Settings(http_port=8080))
    assert path == tmp_path / f"actorserve-{os.getuid()}" / "8080" / "token"
    remove_token_file(path)
