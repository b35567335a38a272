"""Which part a process plays in the multi-process server, and what a child knows of its
parent: the ``_ACTORSERVE_*`` variables the parent sets (see :mod:`actorserve.processes`),
the ready pipe a child writes once serving, and the stdin pipe whose EOF means the
parent is gone."""

from __future__ import annotations

import logging
import os
import sys

import trio

log = logging.getLogger(__name__)

ROLE_VAR = "_ACTORSERVE_ROLE"
SOCKET_VAR = "_ACTORSERVE_ENGINE_SOCKET"
READY_FD_VAR = "_ACTORSERVE_READY_FD"
INDEX_VAR = "_ACTORSERVE_FRONT_INDEX"


def role() -> str | None:
    """``"engine"`` or ``"front"`` in a child of the multi-process server, else None."""
    return os.environ.get(ROLE_VAR) or None


def say_ready() -> None:
    """Tell the parent this child is serving (once)."""
    fd = os.environ.pop(READY_FD_VAR, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"ready\n")
    finally:
        os.close(int(fd))


async def watch_parent(scope: trio.CancelScope) -> None:
    """Cancel ``scope`` when the parent goes away (EOF on the stdin pipe it holds)."""
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as lifeline:
        while await lifeline.receive_some(64):
            pass
    log.warning("the parent process is gone: stopping")
    scope.cancel()


def front_index() -> int:
    return int(os.environ.get(INDEX_VAR, "0"))


def engine_socket() -> str:
    return os.environ[SOCKET_VAR]
