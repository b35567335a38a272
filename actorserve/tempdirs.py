"""The temporary folders a server makes, named so that a later start can tell which ones a
killed server left behind.

A server makes a few: the generated management token's (:mod:`actorserve.server.tokens`), the
engine socket's and the metrics files' of the multi-process server
(:mod:`actorserve.server.processes`), one per extracted ``.mar`` archive
(:mod:`actorserve.torchserve.archive`). Each is ``<tmp>/actorserve-<pid>-<purpose>-<random>``
(mode 0700), ``pid`` being the process that made it. A clean stop removes them; a process
that is killed (SIGKILL, or a child killed by a second Ctrl-C) cannot. :func:`remove_stale`
runs when a server starts and removes this user's folders whose process is gone; a
folder of a process still running (another server) is never touched.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: ``actorserve-<pid>-``: a folder made by :func:`make_temp_folder` (older names have no pid: left alone)
_NAME = re.compile(r"actorserve-(\d+)-")


def make_temp_folder(purpose: str) -> Path:
    """A new private folder (0700) in the temporary folder, named for this process and
    ``purpose``; the caller removes it when done."""
    folder = Path(tempfile.mkdtemp(prefix=f"actorserve-{os.getpid()}-{purpose}-"))
    folder.chmod(0o700)
    return folder


def is_temp_folder(folder: Path, purpose: str) -> bool:
    """``folder`` was made by :func:`make_temp_folder` for ``purpose``."""
    match = _NAME.match(folder.name)
    return match is not None and folder.name[match.end() :].startswith(f"{purpose}-")


def remove_stale(root: Path | None = None) -> list[Path]:
    """Remove the folders :func:`make_temp_folder` made in ``root`` (default: the temporary folder)
    for processes that are gone, if this user owns them; log them in one line and
    return them. Never raises for a folder it cannot read or remove."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        try:
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid() or _alive(int(match[1])):
                continue
        except OSError:  # gone meanwhile
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    if removed:
        names = ", ".join(sorted(p.name for p in removed))
        log.info("removed %d temporary folder(s) left by servers that were killed: %s", len(removed), names)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process of ours to judge: keep its folder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
