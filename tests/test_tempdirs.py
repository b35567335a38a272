"""Temporary folders: a server killed without its cleanup (SIGKILL) leaves its folders
behind; the next start removes them, and never a folder of a process still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.servers import identity_folder, start_server

from actorserve.tempdirs import make_temp_folder, remove_stale


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_folders_of_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = tmp_path / f"actorserve-{dead_pid()}-auth-abc"
    (gone / "sub").mkdir(parents=True)
    (gone / "sub" / "token").write_text("x")
    running = tmp_path / f"actorserve-{os.getpid()}-run-abc"  # this process: alive
    running.mkdir()
    older = tmp_path / "actorserve-abcdefgh"  # a name without a pid: not ours to judge
    older.mkdir()
    unrelated = tmp_path / f"other-{dead_pid()}-x"
    unrelated.mkdir()
    assert remove_stale(tmp_path) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (running, older, unrelated))


def test_a_folder_is_private_and_named_for_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = make_temp_folder("mar-x")
    assert folder.parent == tmp_path
    assert folder.name.startswith(f"actorserve-{os.getpid()}-mar-x-")
    assert folder.stat().st_mode & 0o777 == 0o700
    assert remove_stale() == []  # its process (this one) is alive
    assert folder.exists()


def test_the_next_start_removes_what_a_killed_server_left(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = {"TMPDIR": str(tmp_path)}
    # one small model, not the built-in ones (the text model's torch load is seconds of
    # each start): what is checked is the server's own temporary folders
    models = str(identity_folder(tmp_path_factory.mktemp("models")))
    killed = start_server("--http-port", "0", "--grpc-port", "off", "--api-workers", "2", models, env=env)
    try:
        killed.wait_for("serving with 2 front process", 60)
        left = sorted(p.name for p in tmp_path.iterdir())
        assert [name.split("-")[2] for name in left] == ["auth", "run"], left  # token; socket + metrics
        killed.process.send_signal(signal.SIGKILL)  # no cleanup; the children see it and stop
        killed.process.wait(timeout=30)
    finally:
        killed.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == left
    again = start_server("--http-port", "0", "--grpc-port", "off", "--api-workers", "0", models, env=env)
    try:
        removed = again.wait_for(
            r"removed 2 temporary folder\(s\) left by servers that were killed: (.*)", 60
        )
        assert removed[1] == ", ".join(left)
        again.wait_for("REST listening", 60)
        now = [p.name for p in tmp_path.iterdir()]
        assert now and not set(now) & set(left)  # only the new server's own token folder
    finally:
        again.stop()
    assert list(tmp_path.iterdir()) == []  # a clean stop removes its own
