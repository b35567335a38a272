"""The multi-process server (``python -m actorserve --api-workers N``): one engine process,
N front processes, and the parent that starts, watches and stops them::

    parent: binds the listening sockets (REST, gRPC, extra ports) once, then supervises
      |- engine process: every model, sequence and batcher; serves the fronts on a Unix socket
      `- front 1..N:    REST + gRPC on the inherited sockets, an EngineClient to the engine

Like vLLM's API-server / EngineCore split: per-token Python of the transports (HTTP
parsing, SSE framing, protobuf) runs in the fronts, the step loop in the engine process,
so the two no longer share one GIL. All state lives in the engine, so any front serves
any sequence.

Children are started in their own session (a Ctrl-C or a signal to the parent's process
group reaches only the parent, which then stops them in order: fronts drain first, then
the engine). Each child holds the read end of a pipe from the parent on its stdin: EOF
means the parent is gone: a front shuts the listening sockets down and exits at once,
the engine within :data:`~actorserve.roles.ORPHAN_EXIT_AFTER` s (see
:func:`~actorserve.roles.watch_parent`). A front that dies is restarted
(its own connections are lost); the engine dying stops the server with exit code 1.

The children re-read the same command line and environment as the parent, so they build
the same :class:`~actorserve.settings.Settings`; ``_ACTORSERVE_*`` variables tell them their
role, the engine's socket and the inherited file descriptors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from .auth import TOKENS_FD_VAR, read_tokens, remove_token_file, token_handoff, with_token
from .engine import open_engine
from .gauges import watch_engine
from .heaptrim import freeze_startup_objects, trim_heap_when_idle
from .listeners import BACKLOG, Listeners, log_addresses, open_listeners
from .metrics import MULTIPROC_VAR
from .repository import ModelRepository
from .roles import (
    INDEX_VAR,
    READY_FD_VAR,
    ROLE_VAR,
    SOCKET_VAR,
    engine_socket,
    front_index,
    role,
    say_ready,
    watch_parent,
)
from .server import Server, serve_transports
from .settings import Settings
from .tempdirs import make_temp_folder, remove_stale

log = logging.getLogger(__name__)

#: a front that dies more often than this within RESTART_WINDOW seconds stops the server
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
#: how long a child gets after SIGTERM beyond the grace period before it is killed
KILL_AFTER = 5.0


class ChildFailed(Exception):
    """A child process could not start, or the engine process died; the message says which."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@attrs.define(eq=False)
class _Child:
    role: str
    index: int
    process: trio.Process
    lifeline: trio.abc.SendStream | None

    @property
    def label(self) -> str:
        return "engine" if self.role == "engine" else f"front {self.index}"


@attrs.define(eq=False)
class ProcessSupervisor:
    """The parent's view of its children; :meth:`shutdown` starts the ordered stop."""

    argv: tuple[str, ...]
    api_workers: int
    grace_period: float
    listeners: Listeners
    engine_socket: Path
    #: variables every child gets besides the parent's own (the metrics folder)
    env: dict[str, str] = attrs.field(factory=dict)
    #: the descriptor of the tokens' file every front inherits (auth.token_handoff)
    tokens_fd: int | None = None
    engine: _Child | None = None
    fronts: dict[int, _Child] = attrs.field(factory=dict)
    stopping: trio.Event = attrs.field(factory=trio.Event)
    exit_code: int = 0

    def shutdown(self) -> None:
        self.stopping.set()

    def stop_now(self) -> None:
        """Kill every child at once (a second signal: nothing waits for the grace period
        or the drain already under way); the parent still removes what they shared."""
        self.grace_period = 0.0
        self.stopping.set()
        for child in (*self.fronts.values(), *([self.engine] if self.engine else [])):
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()

    # -- starting children ----------------------------------------------------------------

    async def _spawn(self, role: str, index: int) -> _Child:
        """Start one child and wait (bounded by nothing but its own start-up) until it
        says it is ready, or raise :class:`ChildFailed` with its exit code."""
        ready_r, ready_w = os.pipe()
        env = {**os.environ, **self.env}
        env[ROLE_VAR] = role
        env[SOCKET_VAR] = str(self.engine_socket)
        env[READY_FD_VAR] = str(ready_w)
        env[INDEX_VAR] = str(index)
        pass_fds = [ready_w]
        if role == "front":  # the listening sockets and the tokens
            for var, fd in self.listeners.for_child().items():
                env[var] = str(fd)
                pass_fds.append(fd)
            if self.tokens_fd is not None:
                env[TOKENS_FD_VAR] = str(self.tokens_fd)
                pass_fds.append(self.tokens_fd)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "actorserve", *self.argv],
                env=env,
                pass_fds=pass_fds,
                stdin=subprocess.PIPE,
                start_new_session=True,
            )
        finally:
            os.close(ready_w)
        child = _Child(role, index, process, process.stdin)
        label = child.label
        async with trio.lowlevel.FdStream(ready_r) as ready:
            line = b""
            while not line.endswith(b"\n"):
                chunk = await ready.receive_some(64)
                if not chunk:
                    break
                line += chunk
        if line.strip() != b"ready":
            code = await process.wait()
            raise ChildFailed(f"the {label} process exited during start-up (exit code {code})", code or 1)
        log.info("%s process started (pid %d)", label, process.pid)
        return child

    # -- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> int:
        """Start the engine, then the fronts; watch them until :meth:`shutdown` or the
        engine's death; stop everything in order. Returns the exit code."""
        try:
            try:
                self.engine = await self._spawn("engine", 0)
                for index in range(1, self.api_workers + 1):
                    self.fronts[index] = await self._spawn("front", index)
            except ChildFailed as exc:
                # the child said why on the shared stderr; exit with its code, no second line
                log.info("%s", exc)
                self.exit_code = exc.exit_code
                self.stopping.set()
                task_status.started()
                return self.exit_code
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_engine, nursery.cancel_scope)
                for index in list(self.fronts):
                    nursery.start_soon(self._watch_front, index)
                await self.stopping.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop_all()
        return self.exit_code

    async def _watch_engine(self, scope: trio.CancelScope) -> None:
        assert self.engine is not None
        code = await self.engine.process.wait()
        if not self.stopping.is_set():
            log.error(
                "the engine process (pid %d) exited with code %d: stopping the server",
                self.engine.process.pid,
                code,
            )
            self.exit_code = 1
            self.stopping.set()

    async def _watch_front(self, index: int) -> None:
        restarts: list[float] = []
        while True:
            child = self.fronts[index]
            code = await child.process.wait()
            if self.stopping.is_set():
                return
            now = trio.current_time()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW] + [now]
            if len(restarts) > MAX_RESTARTS:
                log.error(
                    "front %d died %d times within %.0f s: stopping the server",
                    index,
                    len(restarts),
                    RESTART_WINDOW,
                )
                self.exit_code = 1
                self.stopping.set()
                return
            log.warning(
                "front %d (pid %d) exited with code %d: restarting it", index, child.process.pid, code
            )
            try:
                self.fronts[index] = await self._spawn("front", index)
            except ChildFailed as exc:
                log.error("%s", exc)
                self.exit_code = 1
                self.stopping.set()
                return

    async def _stop_all(self) -> None:
        """Fronts first (they drain their requests), then the engine."""
        await _stop([c for c in self.fronts.values()], self.grace_period)
        if self.engine is not None:
            await _stop([self.engine], self.grace_period)


async def _stop(children: list[_Child], grace: float) -> None:
    """SIGTERM each running child, wait up to ``grace + KILL_AFTER`` s, then SIGKILL."""
    running = [c for c in children if c.process.returncode is None]
    for child in running:
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)
    with trio.move_on_after(grace + KILL_AFTER):
        for child in running:
            await child.process.wait()
    for child in running:
        if child.process.returncode is None:
            log.warning("%s (pid %d) did not stop in time: killing it", child.label, child.process.pid)
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()
        if child.lifeline is not None:
            await child.lifeline.aclose()


def engine_socket_path() -> Path:
    """A fresh private folder for the engine's Unix socket (removed by the OS' tmp cleanup
    and by :func:`run_parent` on exit)."""
    return make_temp_folder("run") / "engine.sock"


__all__ = [
    "ChildFailed",
    "ProcessSupervisor",
    "engine_socket",
    "engine_socket_path",
    "front_index",
    "role",
    "run_engine_child",
    "run_front_child",
    "run_parent",
    "say_ready",
    "watch_parent",
]


# -- the three roles, as run by ``python -m actorserve`` ----------------------------------------


async def run_parent(settings: Settings, argv: Sequence[str]) -> int:
    """The parent: bind the sockets (a port in use fails here, before any child starts),
    start the engine and ``settings.api_workers`` fronts, stop them on SIGINT / SIGTERM
    (a second signal kills them at once). Returns the exit code."""
    listeners = open_listeners(settings)
    remove_stale()  # what servers killed before left behind
    folder_socket = engine_socket_path()
    settings, token_file = with_token(settings)  # one token for every child
    env = {MULTIPROC_VAR: str(folder_socket.parent)}  # every process's metrics, summed by a scrape
    handoff = None
    try:
        # the fronts get the tokens by descriptor, not in a variable that model code could read
        handoff = token_handoff(read_tokens(settings))
        tokens_fd = None if handoff is None else handoff.fileno()
        supervisor = ProcessSupervisor(
            tuple(argv), settings.api_workers, settings.grace_period, listeners, folder_socket, env, tokens_fd
        )
        async with trio.open_nursery() as nursery:

            async def supervise(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                supervisor.exit_code = await supervisor.run(task_status=task_status)
                nursery.cancel_scope.cancel()

            nursery.start_soon(_parent_signals, supervisor, nursery.cancel_scope)
            await nursery.start(supervise)
            if not supervisor.stopping.is_set():
                log_addresses(listeners, settings.api_workers)
    finally:
        listeners.close()
        shutil.rmtree(folder_socket.parent, ignore_errors=True)  # the socket and the metrics files
        if handoff is not None:
            handoff.close()
        if token_file is not None:
            remove_token_file(token_file)
    code = supervisor.exit_code
    log.info("actorserve stopped%s", f" (exit code {code})" if code else "")  # as one process ends
    return code


async def _parent_signals(supervisor: ProcessSupervisor, scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if supervisor.stopping.is_set():
                log.warning("second %s: stopping every process now", name)
                supervisor.stop_now()
                scope.cancel()
                return
            log.info(
                "%s: shutting down gracefully (fronts first, then the engine; in-flight requests have %.1f s)",
                name,
                supervisor.grace_period,
            )
            supervisor.shutdown()


async def run_engine_child(settings: Settings, repository: ModelRepository) -> None:
    """The engine process: load every model, serve the fronts on the Unix socket the
    parent named, until SIGTERM (drain within the grace period) or the parent's death."""
    from .ipc.engine_side import open_unix_listener, serve_fronts

    listener = await open_unix_listener(engine_socket(), backlog=BACKLOG)
    repository = repository.with_archive_limits(settings)
    async with open_engine(settings, repository=repository) as engine, trio.open_nursery() as nursery:
        nursery.start_soon(watch_parent, nursery.cancel_scope)
        watch_engine(engine)
        nursery.start_soon(engine.metrics.keep_fresh)  # the live-work gauges the fronts' scrapes read
        nursery.start_soon(trim_heap_when_idle)  # its C heap back to the system once idle after load
        await nursery.start(serve_fronts, engine, listener)
        freeze_startup_objects()
        say_ready()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
        log.info("engine: stopping (in-flight requests have %.1f s)", settings.grace_period)
        await engine.aclose(settings.grace_period)
        nursery.cancel_scope.cancel()


async def run_front_child(settings: Settings) -> None:
    """A front process: the transports on the inherited sockets, an engine client to the
    engine process; SIGTERM drains (a second one stops at once)."""
    from .ipc.client import open_engine_client

    listeners = Listeners.inherited()
    try:
        async with open_engine_client(engine_socket()) as client, trio.open_nursery() as nursery:

            async def transports(*, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
                await serve_transports(client, settings, listeners, announce=False, task_status=task_status)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_parent, nursery.cancel_scope, list(listeners.sockets().values()))
            server: Server = await nursery.start(transports)
            freeze_startup_objects()
            say_ready()
            nursery.start_soon(_front_signals, server, nursery.cancel_scope)
    finally:
        listeners.close()


async def _front_signals(server: Server, scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if server.stopping:
                scope.cancel()
                return
            server.shutdown()
