"""The engine process: ``python -m actorserve.server.engine_main SOCKET [MODEL_FOLDER ...]``.

Loads the built-in models (and every model under each ``MODEL_FOLDER``), serves front
connections on a new Unix socket at ``SOCKET``, then prints one line
``actorserve-engine ready <SOCKET>`` to stdout, so a parent can wait for it. Runs until
SIGTERM or SIGINT: then stops accepting, closes the fronts' connections, shuts the
engine down (sequences end ``shutdown``) and removes the socket file.

Internal: the multi-process server starts it; benchmarks/ipc.py does too.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys

import trio

from ..engine import open_engine
from ..ipc.engine_side import open_unix_listener, serve_fronts
from ..ipc.frames import DEFAULT_LIMITS, LinkLimits
from ..models import builtin_settings as builtin_models
from ..settings import ModelSettings, Settings, discover_models
from . import clock
from .logformat import quiet_protocol_loggers

READY_LINE = "actorserve-engine ready"


async def run_engine(
    socket_path: str,
    settings: Settings,
    *,
    limits: LinkLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``settings``' models to fronts at ``socket_path`` until cancelled; reports
    started once the socket accepts connections. Removes the socket file on exit."""
    async with open_engine(settings) as engine:
        listener = await open_unix_listener(socket_path)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(serve_fronts, engine, listener, limits=limits))
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):  # runs as the service is cancelled
                await trio.Path(socket_path).unlink(missing_ok=True)


async def _main(socket_path: str, settings: Settings) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_engine, socket_path, settings)
            print(f"{READY_LINE} {socket_path}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m actorserve.server.engine_main", description="the actorserve engine process (internal)"
    )
    parser.add_argument("socket", help="path of the Unix socket to create")
    parser.add_argument("folders", nargs="*", help="model folders to serve besides the built-in models")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("ACTORSERVE_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    quiet_protocol_loggers()
    models: list[ModelSettings] = builtin_models()
    for folder in args.folders:
        models.extend(discover_models(folder))
    clock.run(_main, args.socket, Settings(models=tuple(models)))


if __name__ == "__main__":
    main()
