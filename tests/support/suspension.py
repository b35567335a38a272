"""A coroutine awaited with a hook at its first suspension, to write a schedule trio
allows but rarely picks (trio runs the tasks of one batch in either order): see what
has happened when a call first yields to the scheduler, or keep its task away until
other tasks have run."""

from __future__ import annotations

import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

import trio

T = TypeVar("T")


@types.coroutine
def at_first_suspension(
    coro: Coroutine[Any, Any, T],
    *,
    probe: Callable[[], None] | None = None,
    hold: trio.Event | None = None,
) -> Generator[Any, Any, T]:
    """``await at_first_suspension(coro, ...)`` is ``await coro``, except that ``probe()``
    runs when ``coro`` first suspends (or returns without suspending), and, once trio
    resumes it there, it comes back only after ``hold`` is set: as if the scheduler had
    run every other task first. Every later suspension passes through unchanged."""
    send: Callable[[Any], Any] = coro.send
    value: Any = None
    first = True
    while True:
        try:
            trap = send(value)
        except StopIteration as done:
            if first and probe is not None:
                probe()
            return done.value  # type: ignore[no-any-return]
        if first and probe is not None:
            try:
                probe()
            except BaseException:
                coro.close()  # its cancel scopes exit in order
                raise
        try:
            value, send = (yield trap), coro.send
        except BaseException as exc:  # trio cancelling the task: handed on to coro
            value, send = exc, coro.throw
        if first and hold is not None:
            yield from hold.wait().__await__()
        first = False
