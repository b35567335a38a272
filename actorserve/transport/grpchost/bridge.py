"""Where grpclib's asyncio meets trio: grpclib runs on a trio-asyncio loop inside the
caller's trio run, so both sides share one thread and neither can block the other.

:func:`to_trio` is awaited on the asyncio side and runs a trio function in a new trio
task; cancelling the awaiting asyncio task cancels that trio task (so a client that goes
away cancels its request in the engine). :func:`to_aio` is awaited on the trio side and
runs an asyncio coroutine function on grpclib's loop; cancelling the trio side cancels
the asyncio task. Each hop costs a task switch on both loops: callers hop once per
message read and once per batch of messages written, never per response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpclib.utils
import trio_asyncio

from ...tracing import TRACE
from ..owner import OWNER

# grpclib binds ``asyncio.current_task`` once, when it is imported. Imported before
# trio_asyncio (the betterproto2 stubs, a client, a test), it holds CPython's C function,
# which on Python 3.12+ cannot see trio_asyncio's loop: every handler then failed with
# "no running event loop" (seen on an H100 machine's Python 3.12; 3.11 is unaffected).
# trio_asyncio installs a ``current_task`` that can; grpclib must call that one.
grpclib.utils._current_task = asyncio.current_task

T = TypeVar("T")


def to_trio(afn: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]:
    """From asyncio: ``await to_trio(afn, *args)`` runs ``afn(*args)`` as a trio task,
    which sees the calling task's :data:`~actorserve.transport.owner.OWNER` and
    :data:`~actorserve.tracing.TRACE` (trio_asyncio carries no context variable over)."""
    owner, traced = OWNER.get(), TRACE.get()
    if owner is not None or traced is not None:
        return trio_asyncio.trio_as_aio(_as_caller)(owner, traced, afn, *args)  # type: ignore[no-any-return]
    return trio_asyncio.trio_as_aio(afn)(*args)  # type: ignore[no-any-return]


async def _as_caller(
    owner: str | None, traced: str | None, afn: Callable[..., Awaitable[T]], *args: Any
) -> T:
    OWNER.set(owner)  # this trio task's own context: nothing else sees it
    TRACE.set(traced)
    return await afn(*args)


async def to_aio(afn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """From trio: run ``afn(*args)`` on grpclib's asyncio loop and return its result."""
    return await trio_asyncio.aio_as_trio(afn)(*args)  # type: ignore[no-any-return]


__all__ = ["to_aio", "to_trio"]
