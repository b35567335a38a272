"""Domain errors of actorserve.

These are the errors the engine raises; they carry no HTTP or gRPC status. One table in
``actorserve.transport.errors`` maps each class to a status on the wire. The tree::

    ActorServeError
    ├── BadInput             the request is malformed or does not fit the model
    ├── ModelNotFound        no such model or version
    ├── ModelNotReady        the model exists but is not loaded (yet / any more)
    ├── ShuttingDown         the engine no longer accepts work
    ├── SequenceNotFound     unknown, ended or expired sequence id
    │   └── SequenceNotHeld  an id this replica never held (sent to the wrong replica?)
    ├── SequenceConflict     a start for a sequence id that is already open
    ├── Overloaded           a bounded queue or limit is full; retry later
    └── ModelFailed          the model raised; the message includes the exception

A message is always meant for the client: it says what was wrong and, where it helps,
what was expected.
"""

from __future__ import annotations

import logging

log = logging.getLogger("actorserve.model")


#: Longest message a client is told: a message that repeats client input (a key, a
#: value, a list of names) is cut here, so an error never costs more than its request.
MAX_MESSAGE_CHARS = 4096


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    more = f"... ({len(text) - limit} more characters)"
    return text[: max(0, limit - len(more))] + more


class ActorServeError(Exception):
    """Base class of every error the engine reports to a client; its :attr:`message`
    (what every transport sends) is at most :data:`MAX_MESSAGE_CHARS` long."""

    @property
    def message(self) -> str:
        return shorten(str(self.args[0])) if self.args else type(self).__name__


class BadInput(ActorServeError):
    """The request cannot be served as sent (shape, datatype, missing input, ...)."""


class ModelNotFound(ActorServeError):
    """No model (or no version of it) with that name is known."""


class ModelNotReady(ActorServeError):
    """The model is known but not ready to serve."""


class ShuttingDown(ActorServeError):
    """The engine or model is stopping and accepts no new work."""


class SequenceNotFound(ActorServeError):
    """A request named a sequence that is not open; the message says why."""


class SequenceNotHeld(SequenceNotFound):
    """A request (not a start) named a sequence this replica does not hold and never
    ended: a proxy sent it to the wrong replica, or the replica that held it died or
    restarted. The message names this replica and the id; the request never starts
    fresh state. Same status as :class:`SequenceNotFound` (404 / NOT_FOUND)."""

    #: what the REST error body's ``reason`` says (docs/deploy.md#stickiness)
    reason = "sequence_not_held"

    def __init__(self, *args: object) -> None:
        """``SequenceNotHeld(message)`` (as rebuilt from the engine link) or
        ``SequenceNotHeld(sequence_id, message)`` (where the id is known)."""
        self.sequence_id: str | None = None
        if len(args) == 2 and isinstance(args[0], str):
            self.sequence_id, args = args[0], args[1:]
        super().__init__(*args)


class SequenceConflict(ActorServeError):
    """A sequence start named an id that is already open."""


class Overloaded(ActorServeError):
    """A bounded resource is full (mailbox, pending queue, sequence limit).

    ``retry_after``: seconds a client should wait, when known (an upstream's
    ``Retry-After``); the transports tell the client (REST: the ``Retry-After`` header).
    ``bound`` names which bound was full (``mailbox_full``, ``max_pending``,
    ``max_sequences``; "" for another), for the metrics."""

    def __init__(self, *args: object, retry_after: int | None = None, bound: str = "") -> None:
        super().__init__(*args)
        self.retry_after = retry_after
        self.bound = bound


class ModelFailed(ActorServeError):
    """The model raised while serving this request."""

    @classmethod
    def wrap(cls, model: str, exc: BaseException, during: str = "") -> ModelFailed:
        """The error to raise for ``exc``, an exception out of model ``model``'s code:
        ``model 'm' failed[ during]: Type: message``. Logs it with its traceback, so a
        client reads one line while the operator gets the whole story. Raise it
        ``from None`` (the log has the cause)."""
        what = f"model {model!r} failed{' ' + during if during else ''}"
        log.error("%s", what, exc_info=exc)
        return cls(f"{what}: {type(exc).__name__}: {exc}")
