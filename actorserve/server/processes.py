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
the engine). With ``drain_timeout`` (scale-in, docs/deploy.md#drain) the parent first
sends the engine :data:`SCALE_IN_SIGNAL`: the engine serves only its open sequences
(:func:`~actorserve.engine.scalein.drain_sequences`: not ready, new starts refused, which the
fronts pass on as 503 + ``Retry-After`` / UNAVAILABLE, since every start and every
readiness answer is the engine's) and sends the parent the same signal when none is left
or the timeout passed; the ordered stop follows (what the children run:
:mod:`actorserve.server.children`).

Each child holds the read end of a pipe from the parent on its stdin: EOF means the
parent is gone: a front shuts the listening sockets down and exits at once,
the engine within :data:`~actorserve.server.roles.ORPHAN_EXIT_AFTER` s (see
:func:`~actorserve.server.roles.watch_parent`). A front that dies is restarted
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
from prometheus_client.multiprocess import mark_process_dead

from ..metrics import MULTIPROC_VAR
from ..settings import Settings
from ..tempdirs import make_temp_folder, remove_stale
from .children import run_engine_child, run_front_child
from .listeners import Listeners, log_addresses, open_listeners
from .roles import (
    INDEX_VAR,
    READY_FD_VAR,
    ROLE_VAR,
    SCALE_IN_SIGNAL,
    SOCKET_VAR,
    engine_socket,
    front_index,
    role,
    say_ready,
    watch_parent,
)
from .tokens import TOKENS_FD_VAR, read_tokens, remove_token_file, token_handoff, with_token

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
    #: seconds the engine serves its open sequences before the ordered stop (0: no drain)
    drain_timeout: float = 0.0
    #: set when the engine says its drain is over (or it died, or :meth:`stop_now`)
    drained: trio.Event = attrs.field(factory=trio.Event)

    def shutdown(self) -> None:
        self.stopping.set()

    def stop_now(self) -> None:
        """Kill every child at once (a second signal: nothing waits for the grace period
        or the drain already under way); the parent still removes what they shared."""
        self.grace_period = 0.0
        self.drain_timeout = 0.0
        self.drained.set()
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
        if role == "engine":  # known before it is ready: a stop during its start-up stops it too
            self.engine = child
        else:
            self.fronts[index] = child
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
                started = await self._start_children()
            except ChildFailed as exc:
                # the child said why on the shared stderr; exit with its code, no second line
                log.info("%s", exc)
                self.exit_code = exc.exit_code
                self.stopping.set()
                task_status.started()
                return self.exit_code
            task_status.started()
            if not started:  # a signal during start-up: stop what started, start nothing more
                return self.exit_code
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_engine, nursery.cancel_scope)
                for index in list(self.fronts):
                    nursery.start_soon(self._watch_front, index)
                await self.stopping.wait()
                await self._scale_in()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop_all()
        return self.exit_code

    async def _start_children(self) -> bool:
        """Start the engine, then the fronts, each once the one before is ready; False
        when :meth:`shutdown` came first (a SIGTERM during a slow model load): the child
        starting then is not waited for and no other is started (the ordered stop follows)."""
        failed: ChildFailed | None = None
        with trio.CancelScope() as starting:
            async with trio.open_nursery() as nursery:

                async def cancel_on_stop() -> None:
                    await self.stopping.wait()
                    starting.cancel()

                nursery.start_soon(cancel_on_stop)
                try:
                    await self._spawn("engine", 0)
                    for index in range(1, self.api_workers + 1):
                        await self._spawn("front", index)
                except ChildFailed as exc:  # raised as itself, not in the nursery's group
                    failed = exc
                nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return not starting.cancelled_caught

    async def _scale_in(self) -> None:
        """Before the ordered stop of a healthy server: the engine's drain (see the module
        docstring), bounded by ``drain_timeout`` and :data:`KILL_AFTER`. The fronts keep
        serving meanwhile (one that dies is not restarted)."""
        engine = self.engine
        if (
            not self.drain_timeout
            or self.exit_code
            or engine is None
            or engine.process.returncode is not None
        ):
            return
        log.info("draining: the engine serves its open sequences for up to %.1f s", self.drain_timeout)
        with contextlib.suppress(ProcessLookupError):
            engine.process.send_signal(SCALE_IN_SIGNAL)
        with trio.move_on_after(self.drain_timeout + KILL_AFTER):
            await self.drained.wait()

    async def _watch_engine(self, scope: trio.CancelScope) -> None:
        assert self.engine is not None
        code = await self.engine.process.wait()
        self.drained.set()  # nothing left to drain
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
            self._forget_gauges(child)
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
                await self._spawn("front", index)
            except ChildFailed as exc:
                log.error("%s", exc)
                self.exit_code = 1
                self.stopping.set()
                return

    def _forget_gauges(self, child: _Child) -> None:
        """Drop a dead child's live gauges from the metrics folder: a front killed with
        requests in flight would otherwise add its last count to every scrape for good
        (its counters and histograms stay: what it served was served)."""
        folder = self.env.get(MULTIPROC_VAR)
        if folder:
            mark_process_dead(child.process.pid, folder)  # type: ignore[no-untyped-call]

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


# -- the parent, as run by ``python -m actorserve`` (the children: actorserve.server.children) ---------


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
            tuple(argv),
            settings.api_workers,
            settings.grace_period,
            listeners,
            folder_socket,
            env,
            tokens_fd,
            drain_timeout=settings.drain_timeout,
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
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, SCALE_IN_SIGNAL) as signals:
        async for signum in signals:
            if signum == SCALE_IN_SIGNAL:  # the engine's drain is over
                supervisor.drained.set()
                continue
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
