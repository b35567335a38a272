"""Exception groups as callers expect errors: a trio nursery wraps whatever its tasks
raise in a :class:`BaseExceptionGroup`, and :func:`raise_single` unwraps a group that
holds one error, for the engine (:mod:`actorserve.engine`), the front's engine client
(:mod:`actorserve.ipc.client`) and the server alike."""

from __future__ import annotations

from typing import NoReturn


def raise_single(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Re-raise a group holding one error (however deeply nested) as that error, so a
    caller's ``except OSError`` or ``except ModelNotFound`` works; else the group."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    if error is group:
        raise group
    raise error from error.__cause__


__all__ = ["raise_single"]
