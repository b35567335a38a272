"""TorchServe's inference call onto the engine, shared by its REST and gRPC doors.

Stateful headers are read as TorchServe's frontend reads them: ``ts_request_sequence_id``
names the sequence, ``..._start`` / ``..._end`` (true/false) mark its first / last
request; the handler sees every header. On a model with sequence batching a request
without an id starts a new sequence ``ts-seq-<uuid>`` (the handler sees the start header
and the client gets the id back; the uuid's 128 bits all come from :mod:`secrets`: the
id is a bearer secret). TorchServe opens a sequence on the first request that
names it and lets its handler decide what a missing start means; so do we: an unknown
id is opened on our side without telling the handler it is a start, and a start for an
id already open goes to that sequence (the handler resets it).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import trio

from ...api import EngineAPI, ResponseIterator, bool_parameter
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
from ...torchserve_envelope import SEQUENCE_PLATFORM, Answer, HeaderNames, make_request
from ...torchserve_envelope import answer as answer_of

#: how long a model's "has sequence batching" is remembered, in seconds
PLATFORM_TTL: Final = 2.0

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


def names_no_model(error: TsError) -> bool:
    """``error`` says the model (or version) a request named does not exist: its name
    came from the client, so it is no metrics label."""
    return error.type in ("ModelNotFoundException", "ModelVersionNotFoundException")


def answer_error(answer: Answer) -> TsError:
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


@attrs.frozen
class Call:
    """One prediction to make: routed model, raw inputs, the headers the handler sees."""

    model: str
    version: str | None
    inputs: Mapping[str, tuple[bytes, str]]
    headers: Mapping[str, str]


class Predictor:
    """Makes TorchServe predictions on an engine (one per transport)."""

    def __init__(self, engine: EngineAPI, names: HeaderNames | None = None) -> None:
        self.engine = engine
        self.names = names or HeaderNames.from_environ()
        self._sequence_models: dict[tuple[str, str | None], tuple[float, bool]] = {}

    async def _has_sequences(self, model: str, version: str | None) -> bool:
        key = (model, version)
        now = trio.current_time()
        cached = self._sequence_models.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        platform = (await self.engine.metadata(model, version)).platform
        value = platform == SEQUENCE_PLATFORM
        if len(self._sequence_models) > 1024:
            self._sequence_models.clear()
        self._sequence_models[key] = (now + PLATFORM_TTL, value)
        return value

    @asynccontextmanager
    async def stream(self, call: Call) -> AsyncIterator[tuple[ResponseIterator, str | None]]:
        """The answers to ``call`` and its sequence id (None: not in a sequence);
        errors at the start (unknown model, full queue) are raised here, an unknown
        model or version in TorchServe's words (:class:`TsRefusal`)."""
        try:
            async with self._stream(call) as started:
                yield started
        except ModelNotFound:
            raise await not_found(self.engine, call.model, call.version) from None

    @asynccontextmanager
    async def _stream(self, call: Call) -> AsyncIterator[tuple[ResponseIterator, str | None]]:
        names = self.names
        headers = {k.lower(): v for k, v in call.headers.items()}
        sequence_id = headers.get(names.sequence_id) or None
        start = _flag(headers, names.sequence_start)
        end = _flag(headers, names.sequence_end)
        if sequence_id is None and (start or await self._has_sequences(call.model, call.version)):
            sequence_id = f"ts-seq-{uuid.UUID(bytes=secrets.token_bytes(16))}"
            headers[names.sequence_id] = sequence_id
            headers[names.sequence_start] = "true"
            start = True
        if sequence_id is None:
            attempts: list[dict[str, Any]] = [{}]
        else:
            # TorchServe opens a sequence on the first request naming it, and passes a
            # start for an open one to the handler: so try what the client said, then
            # the other way round.
            base = {"sequence_id": sequence_id, "sequence_end": end}
            attempts = [{**base, "sequence_start": start}, {**base, "sequence_start": not start}]
        async with contextlib.AsyncExitStack() as stack:
            for number, parameters in enumerate(attempts):
                request = make_request(
                    call.inputs, headers, model=call.model, version=call.version, parameters=parameters
                )
                stream = self.engine.infer_stream(request, model=call.model, version=call.version)
                try:
                    responses = await stack.enter_async_context(stream)
                    break
                except (SequenceNotFound, SequenceConflict) as exc:
                    expected = SequenceConflict if start else SequenceNotFound
                    if number + 1 == len(attempts) or not isinstance(exc, expected):
                        raise
            yield responses, sequence_id


def _flag(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name)
    if value is None:
        return False
    try:
        return bool_parameter(value, name)
    except BadInput:
        return False


async def first_answers(responses: ResponseIterator) -> list[Answer]:
    """The answers already waiting (at least one), or [] at the end."""
    try:
        return [answer_of(r) for r in await responses.next_batch()]
    except StopAsyncIteration:
        return []
