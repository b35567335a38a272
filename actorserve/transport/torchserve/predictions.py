"""TorchServe's inference call onto the engine, shared by its REST and gRPC doors.

Stateful headers are read as TorchServe's frontend reads them: ``ts_request_sequence_id``
names the sequence, ``..._start`` / ``..._end`` (true/false) mark its first / last
request; the handler sees every header but the client's credentials
(:data:`~actorserve.transport.auth.CREDENTIAL_HEADERS`). On a model with sequence batching a request
without an id starts a new sequence ``ts-seq-<uuid>`` (the handler sees the start header
and the client gets the id back; the uuid's 128 bits all come from :mod:`secrets`: the
id is a bearer secret). TorchServe opens a sequence on the first request that
names it and lets its handler decide what a missing start means; so do we: an unknown
id is opened on our side without telling the handler it is a start, and a start for an
id already open goes to that sequence (the handler resets it).
"""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import trio

from ...api import EngineAPI, ResponseIterator, bool_parameter, with_control
from ...errors import BadInput, ModelNotFound, SequenceConflict, SequenceNotFound
from ...torchserve_envelope import SEQUENCE_PLATFORM, Answer, HeaderNames, make_request
from ...torchserve_envelope import answer as answer_of
from ..auth import without_credentials
from .errors import not_found

#: how long a model's "has sequence batching" is remembered, in seconds
PLATFORM_TTL: Final = 2.0


@attrs.frozen
class Call:
    """One prediction to make: routed model, raw inputs, the headers the handler sees
    (never a credential: ``Authorization``, ``Cookie``, ... are dropped as the call is
    made, whichever door makes it)."""

    model: str
    version: str | None
    inputs: Mapping[str, tuple[bytes, str]]
    headers: Mapping[str, str] = attrs.field(converter=without_credentials)


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
                request = with_control(
                    make_request(
                        call.inputs, headers, model=call.model, version=call.version, parameters=parameters
                    )
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
