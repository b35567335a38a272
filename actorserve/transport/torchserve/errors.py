"""TorchServe's error replies, shared by its REST and gRPC doors and its management
operations: :class:`TsError` (``{"code", "type", "message"}``), the refusals the doors word
themselves (:class:`TsRefusal`), and :func:`ts_error`, the table from the engine's domain
errors to TorchServe's status and exception type.
"""

from __future__ import annotations

import json
from typing import Final

import attrs

from ...api import EngineAPI
from ...errors import (
    ActorServeError,
    BadInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    SequenceConflict,
    SequenceNotFound,
    ShuttingDown,
)
from ...torchserve import envelope

#: domain error -> (HTTP status, TorchServe's exception type) as TorchServe answers
_ERRORS: Final[dict[type[ActorServeError], tuple[int, str]]] = {
    BadInput: (400, "BadRequestException"),
    ModelNotFound: (404, "ModelNotFoundException"),
    SequenceNotFound: (404, "SequenceNotFoundException"),
    SequenceConflict: (409, "ConflictStatusException"),
    Overloaded: (503, "ServiceUnavailableException"),
    ModelNotReady: (503, "ServiceUnavailableException"),
    ShuttingDown: (503, "ServiceUnavailableException"),
}


@attrs.frozen
class TsError:
    """An error as TorchServe reports it: ``{"code", "type", "message"}``."""

    code: int
    type: str
    message: str

    def json(self) -> bytes:
        return json.dumps({"code": self.code, "type": self.type, "message": self.message}, indent=2).encode()


class TsRefusal(Exception):
    """A refusal the TorchServe doors word themselves, answered exactly as ``error``
    says (the engine's domain errors go through the table above instead)."""

    def __init__(self, error: TsError) -> None:
        super().__init__(error.message)
        self.error = error


def model_not_found(name: str) -> TsRefusal:
    """TorchServe's words for an unknown model (its ``ModelManager``)."""
    return TsRefusal(TsError(404, "ModelNotFoundException", f"Model not found: {name}"))


def version_not_found(name: str, version: str) -> TsRefusal:
    """TorchServe's words for an unknown version of a known model."""
    message = f"Model version: {version} does not exist for model: {name}"
    return TsRefusal(TsError(404, "ModelVersionNotFoundException", message))


async def not_found(engine: EngineAPI, name: str, version: str | None) -> TsRefusal:
    """The engine said :class:`ModelNotFound` for ``name`` / ``version``: which of
    TorchServe's two refusals that is (asked only on this error path)."""
    if version and any(m.name == name for m in await engine.models()):
        return version_not_found(name, version)
    return model_not_found(name)


def ts_error(error: BaseException) -> TsError:
    if isinstance(error, TsRefusal):
        return error.error
    for cls in type(error).__mro__:
        entry = _ERRORS.get(cls)
        if entry is not None:
            return TsError(entry[0], entry[1], str(error.args[0]) if error.args else cls.__name__)
    if isinstance(error, ActorServeError):
        return TsError(500, "InternalServerException", error.message)
    return TsError(500, "InternalServerException", f"internal error: {type(error).__name__}")


def answer_error(answer: envelope.Answer) -> TsError:
    """A handler's failed answer (status >= 400) as an error."""
    message = answer.message
    try:
        parsed = json.loads(answer.body)
        if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
            return TsError(answer.status, str(parsed.get("type", "")), parsed["message"])
    except ValueError:
        pass
    return TsError(
        answer.status, "InternalServerException", message or answer.body.decode("utf-8", "replace")
    )
