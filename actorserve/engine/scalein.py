"""Scale-in: a replica leaving a group behind a proxy finishes the sequences it holds
before it stops (docs/deploy.md#drain).

On SIGTERM, with ``drain_timeout`` set, :func:`drain_sequences` runs before the
shutdown of ``grace_period``: the engine goes not ready (``/v2/health/ready`` 503, so
probes and proxies take the replica out of rotation), new sequence starts are refused
with :class:`~actorserve.errors.ShuttingDown` (503 + ``Retry-After``; gRPC
UNAVAILABLE), and every other request, above all the next steps of the open
sequences, is served as before. It returns when no sequence is open (they ended or
expired) or ``drain_timeout`` has passed; the shutdown then goes on as without it.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from ..actors.reports import model_statistics
from . import Engine

log = logging.getLogger(__name__)

#: seconds between looks at the open sequences while draining
POLL_INTERVAL: Final = 0.1


def open_sequences(engine: Engine) -> int:
    """Sequences open now in every model version of ``engine``."""
    return sum(model_statistics(host).open_sequences for host in engine.hosts())


async def drain_sequences(engine: Engine, drain_timeout: float) -> int:
    """Serve only the open sequences until none is left or ``drain_timeout`` seconds pass (see
    the module docstring); returns how many were still open. Cancellable."""
    engine.draining = True
    engine.metrics.draining.set(1)
    left = open_sequences(engine)
    log.info(
        "draining: %d open sequence(s) have up to %.1f s to end; new starts are refused", left, drain_timeout
    )
    with trio.move_on_after(drain_timeout):
        while left:
            await trio.sleep(POLL_INTERVAL)
            left = open_sequences(engine)
    if left:
        log.warning("drain_timeout passed with %d sequence(s) open: they end with the shutdown", left)
    return left


__all__ = ["POLL_INTERVAL", "drain_sequences", "open_sequences"]
