"""The server: composition and processes.

:func:`serve` runs an engine and every door in one process;
:mod:`~actorserve.server.processes` runs the default shape (an engine process and N front
processes, :mod:`~actorserve.server.children`) from the parent. Also here: the listening
sockets, the doors list, management tokens, logging set-up and the engine process's entry
(:mod:`~actorserve.server.engine_main`). This is the only layer that may import every other.

``serve`` is imported on first use, so the engine process, which needs only a few of these
modules, does not load every door."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .composition import Server, serve

__all__ = ["Server", "serve"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from . import composition

        return getattr(composition, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
