""":class:`GrpcHost`: what every gRPC call of every door shares, on the asyncio side.

It builds grpclib servers from the doors' handlers (:meth:`GrpcHost.start`), wraps every
method in the token check and the call's record (:func:`.interceptor.guarded`), counts the
calls that work (:meth:`GrpcHost.tracked`) and drains them (:meth:`GrpcHost.shut_down`).
:func:`.server.serve_grpc` runs it on the trio-asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import trio
from grpclib.const import Handler
from grpclib.server import Stream

from ...replica import REPLICA_HEADER, replica_id
from ...settings import Settings
from ..auth import Guard
from ..exchange import Recorder
from .door import GrpcDoor, Method
from .h2 import GrpclibServer
from .interceptor import guarded
from .status import log, shutting_down
from .unary import keep_lean


class _Handlers:
    """A handler table as grpclib wants it (an object with ``__mapping__``)."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        self._handlers = dict(handlers)

    def __mapping__(self) -> dict[str, Handler]:
        return self._handlers


class GrpcHost:
    """The gRPC servers of one process, for every door (see the module docstring).

    :meth:`start` and :meth:`shut_down` run on the asyncio side. ``guard`` says which
    scopes need a bearer token (each door says which scope each of its methods is in);
    calls are recorded by ``recorder``."""

    def __init__(self, settings: Settings, recorder: Recorder, guard: Guard | None = None) -> None:
        self.settings = settings
        self.recorder = recorder
        self.guard = guard if guard is not None and guard.active else None
        #: calls running (asyncio side)
        self.calls = 0
        #: refusing new calls (set on the asyncio side, read on both)
        self.draining = False
        #: set (on the trio side) when draining starts: streams stop reading then.
        self.drain_started = trio.Event()
        self._idle: asyncio.Event | None = None
        #: the asyncio tasks of the calls running, and those the end of the drain cancelled
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ended: set[asyncio.Task[Any]] = set()

    def handlers(self, doors: Sequence[GrpcDoor]) -> dict[str, Handler]:
        """Every method of ``doors``, each wrapped in the token check (by the scope its
        door gives it) and the call's record. Two doors may not serve one method."""
        table: dict[str, Handler] = {}
        for door in doors:
            for path, handler in door.handlers(self).items():
                if path in table:
                    raise ValueError(f"two gRPC doors serve {path}")
                scope = door.auth_scope(path)
                needs = self.guard.needs(scope) if self.guard is not None else None
                table[path] = guarded(
                    path, handler, self.guard if needs is not None else None, self.recorder, needs
                )
        return table

    async def start(self, listener: socket.socket, handlers: Mapping[str, Handler]) -> GrpclibServer:
        """Serve ``handlers`` (from :meth:`handlers`, or a part of them for a port of one
        service) on ``listener``."""
        self._idle = self._idle or asyncio.Event()
        server = GrpclibServer(
            [_Handlers(handlers)],
            fixed_metadata=((REPLICA_HEADER, replica_id(self.settings.replica_id)),),
            idle_timeout=self.settings.grpc_idle_timeout,  # no open stream that long: GOAWAY, closed
            read_timeout=self.settings.read_timeout,  # a frame started and not finished that long: closed
        )
        # grpclib listens again on the socket it is given (its default backlog: 100)
        await server.start(sock=listener, backlog=self.settings.backlog)
        return server

    async def shut_down(self, *servers: GrpclibServer) -> None:
        """Stop listening, refuse new calls, give the calls in flight the grace period,
        end the rest with UNAVAILABLE "the server is shutting down", close the
        connections (of every server :meth:`start` made)."""
        grace = self.settings.grace_period
        self.draining = True
        for server in servers:
            server.stop_listening()
        if self.calls:
            assert self._idle is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        if self.calls:
            log.warning(
                "gRPC: ending %d call(s) still running after the grace period (UNAVAILABLE)", self.calls
            )
            self._ended = set(self._tasks)
            for task in self._ended:
                task.cancel()  # each ends with "the server is shutting down" (see tracked)
            with contextlib.suppress(asyncio.TimeoutError):
                assert self._idle is not None
                await asyncio.wait_for(self._idle.wait(), 1.0)
        for server in servers:
            server.close()
        for server in servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), max(grace, 1.0))
            server.close_connections()

    def tracked(self, func: Method) -> Method:
        """Count the call while it runs; refuse it while draining (every door wraps the
        handlers of its methods that work with it)."""

        async def handler(stream: Stream[Any, Any]) -> None:
            if self.draining:
                raise shutting_down()
            self.calls += 1
            task = asyncio.current_task()
            if task is not None:
                self._tasks.add(task)
            try:
                await func(stream)
            except asyncio.CancelledError:
                if task is None or task not in self._ended:
                    raise
                task.uncancel()  # the grace period is over: a status, not a cut connection
                raise shutting_down() from None
            finally:
                if task is not None:
                    self._tasks.discard(task)
                self.calls -= 1
                if not self.calls and self._idle is not None:
                    self._idle.set()
                    self._idle.clear()  # wakes the current waiter; later ones wait again

        return keep_lean(func, handler)


__all__ = ["GrpcHost"]
