"""The system programs some tests drive (a browser, a proxy, curl), one policy for all:
a test whose program is missing skips, and its reason gives the one command that
installs every such program (``.ci/system-packages``, which the README names next to
the test command). Where :data:`REQUIRE` is set in the environment (``.ci/run`` sets
it), a missing program fails the test instead, so CI runs them all."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the script that installs every system package the suite uses (apt-get, through sudo
#: unless run as root)
INSTALL_SCRIPT = ROOT / ".ci" / "system-packages"
#: what a reader types, from the repository root
INSTALL_COMMAND = ".ci/system-packages"
#: set to 1, a missing program is a failure rather than a skip
REQUIRE = "ACTORSERVE_REQUIRE_SYSTEM_PROGRAMS"
#: where Debian puts daemons, off an ordinary user's PATH
SBIN = (Path("/usr/sbin"), Path("/sbin"))


def find_program(name: str) -> str | None:
    """The path of ``name`` on PATH or in the sbin folders, or None."""
    found = shutil.which(name)
    if found is not None:
        return found
    for folder in SBIN:
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def require_program(name: str, why: str) -> str:
    """The path of the system program ``name``; skips the calling test when it is missing
    (fails it where :data:`REQUIRE` is ``1``), with the install command in the reason.
    ``why`` says what the test needs it for."""
    found = find_program(name)
    if found is not None:
        return found
    message = f"{name} is not installed ({why}); install the suite's system packages with: {INSTALL_COMMAND}"
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{message} ({REQUIRE}=1: a missing program fails)", pytrace=False)
    pytest.skip(message)
