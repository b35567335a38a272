"""Fixtures for every test: the temporary folders the servers under test make (token
files, engine sockets, metrics files, extracted archives) go to a folder pytest owns and
prunes (it keeps the last three runs' ``basetemp``), not the system's temporary folder, so
a test run (and a server a test kills) leaves nothing behind there."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from support.browser import require_chromium


@pytest.fixture(scope="session", autouse=True)
def _temporary_folders_in_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    folder = str(tmp_path_factory.mktemp("tmp"))
    before = (tempfile.tempdir, os.environ.get("TMPDIR"))
    tempfile.tempdir = folder  # this process
    os.environ["TMPDIR"] = folder  # the servers it starts
    try:
        yield
    finally:
        tempfile.tempdir = before[0]
        if before[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[1]


@pytest.fixture
def chromium() -> None:
    """Skips (fails in CI) a browser test where Debian's chromium is missing. A fixture, so
    it runs before the test's trio loop and before the fixtures that start servers: a skip
    raised inside a trio test loses its reason."""
    require_chromium()
