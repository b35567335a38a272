"""Failures on the engine link, with no I/O: a peer's malformed frames
(:class:`WireError`), a bug in the engine (:class:`EngineInternalError`), and the domain
errors in their plain form (class name and message), rebuilt as themselves on the other
side. Re-exported by :mod:`.values`."""

from __future__ import annotations

from typing import Final

from .. import errors
from ..settings import SettingsError


class WireError(Exception):
    """A plain form that the other side cannot have produced: the peer is broken or
    speaks another version. The connection it came on is closed."""


class EngineInternalError(Exception):
    """The engine raised something that is not a domain error (a bug there). Like any
    non-domain error, the transports answer it 500 / INTERNAL with a generic message."""


#: the errors rebuilt as themselves on the other side, by class name
DOMAIN_ERRORS: Final[dict[str, type[Exception]]] = {
    cls.__name__: cls
    for cls in (
        errors.ActorServeError,
        errors.BadInput,
        errors.ModelNotFound,
        errors.ModelNotReady,
        errors.ShuttingDown,
        errors.SequenceNotFound,
        errors.SequenceNotHeld,
        errors.SequenceConflict,
        errors.Overloaded,
        errors.ModelFailed,
        SettingsError,
    )
}


#: how an ``Overloaded`` error's ``retry_after`` rides on its kind: ``Overloaded;7``
_RETRY_AFTER = ";"


def error_to_plain(error: BaseException) -> tuple[str, str]:
    """(class name, message). A subclass of a domain error that is not in the table
    (a model's own ``BadInput`` subclass) travels as its nearest domain ancestor; an
    ``Overloaded`` error's ``retry_after`` travels after its name."""
    if isinstance(error, errors.ActorServeError):
        for cls in type(error).__mro__:
            if DOMAIN_ERRORS.get(cls.__name__) is cls:
                retry_after = getattr(error, "retry_after", None)
                if cls is errors.Overloaded and isinstance(retry_after, int):
                    return f"{cls.__name__}{_RETRY_AFTER}{retry_after}", error.message
                return cls.__name__, error.message
    return type(error).__name__, str(error)


def error_from_plain(kind: str, message: str) -> Exception:
    """The domain error called ``kind``; any other name is an :class:`EngineInternalError`."""
    name, _, retry_after = kind.partition(_RETRY_AFTER)
    cls = DOMAIN_ERRORS.get(name)
    if cls is None:
        return EngineInternalError(f"{kind}: {message}" if message else kind)
    if cls is errors.Overloaded and retry_after.isdigit():
        return errors.Overloaded(message, retry_after=int(retry_after))
    return cls(message)
