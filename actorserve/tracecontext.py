"""What tracing shares between the server's modules and :mod:`actorserve.otel`, which
imports OpenTelemetry: the context variable that names a request's span, and what a
batcher calls on a traced item. No imports; re-exported by :mod:`actorserve.tracing`."""

from __future__ import annotations

import contextvars
from typing import Final, Protocol

#: The ``traceparent`` of the request span this task serves (None: not traced).
TRACE: Final = contextvars.ContextVar[str | None]("actorserve_trace", default=None)


class StepCount(Protocol):
    """What an item's trace reads off its batcher: the steps it has made so far."""

    @property
    def steps(self) -> int: ...


class ItemTrace(Protocol):
    """A batched request's trace, fed by its batcher (:attr:`WorkItem.trace
    <actorserve.actors.workitem.WorkItem.trace>`; None when the request is not traced)."""

    def admitted(self, counts: StepCount) -> None:
        """The item joined the running batch of the replica whose steps ``counts`` counts."""

    def finished(self, submitted_at: float, responses: int, error: BaseException | None) -> None:
        """The item left: it was submitted at ``submitted_at`` (trio's clock, 0: never
        queued for a batch) and made ``responses`` responses."""


__all__ = ["TRACE", "ItemTrace", "StepCount"]
