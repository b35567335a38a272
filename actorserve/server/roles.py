"""Which part a process plays in the multi-process server, and what a child knows of its
parent: the ``_ACTORSERVE_*`` variables the parent sets (see :mod:`actorserve.server.processes`),
the ready pipe a child writes once serving, and the stdin pipe whose EOF means the
parent is gone."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence

import trio

log = logging.getLogger(__name__)

ROLE_VAR = "_ACTORSERVE_ROLE"
SOCKET_VAR = "_ACTORSERVE_ENGINE_SOCKET"
READY_FD_VAR = "_ACTORSERVE_READY_FD"
INDEX_VAR = "_ACTORSERVE_FRONT_INDEX"
#: parent -> engine: start the scale-in drain; engine -> parent: it is over (docs/deploy.md#drain)
SCALE_IN_SIGNAL = signal.SIGUSR1


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


#: seconds an orphaned child gets to stop by itself (cancelled) before it exits hard
ORPHAN_EXIT_AFTER = 1.0


async def watch_parent(scope: trio.CancelScope, listening: Sequence[socket.socket] = ()) -> None:
    """Stop this child when the parent goes away (EOF on the stdin pipe it holds).

    A front (``listening``: its sockets) shuts them down and exits at once: that stops the
    listening for the shared socket itself, in this process and in its sibling fronts
    alike, so new connections are refused rather than accepted and then dropped; its
    streams are cut, and it has nothing else to save (the state is the engine's). The
    engine cancels ``scope`` (models unload) and exits hard if it is still running
    :data:`ORPHAN_EXIT_AFTER` s later. Exit code 1 either way: nobody is left to read it.

    The pipe is read in a thread, not by the loop: a model stuck in code that never
    yields blocks the loop, so a watcher there never sees the EOF; and a cancellation
    alone is not bounded (gRPC drains its calls for the grace period on its way out,
    shielded, waiting on an engine that may never answer, its sockets still listening).

    ``prctl(PR_SET_PDEATHSIG)`` is no second line here: the signal follows the *thread*
    that started the child, and trio starts processes from a worker thread that ends
    once idle, which would kill every child some seconds after a healthy start."""
    token = trio.lowlevel.current_trio_token()
    lifeline = os.dup(sys.stdin.fileno())

    def wait_for_eof() -> None:
        try:
            while os.read(lifeline, 64):
                pass
        finally:
            os.close(lifeline)
        log.warning("the parent process is gone: stopping")
        for sock in listening:
            with contextlib.suppress(OSError):  # closed already, by a stop under way
                sock.shutdown(socket.SHUT_RDWR)
        if not listening:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)
            time.sleep(ORPHAN_EXIT_AFTER)
            log.warning("still running %.1f s after the parent's death: exiting now", ORPHAN_EXIT_AFTER)
        logging.shutdown()
        os._exit(1)

    # abandoned when this task is cancelled (the child stops normally); the thread then
    # goes with the process. Its own limiter: it never holds one of the model threads'.
    await trio.to_thread.run_sync(wait_for_eof, abandon_on_cancel=True, limiter=trio.CapacityLimiter(1))


def front_index() -> int:
    return int(os.environ.get(INDEX_VAR, "0"))


def engine_socket() -> str:
    return os.environ[SOCKET_VAR]
