"""Who the caller of an inference request is, carried from the door to the engine, for
sequences bound to the token that opened them (``bind_sequences_to_token``).

A door learns the caller's token before it reads the request: REST from the
``Authorization`` header (:class:`OwnerScope`, around the REST app), gRPC from the call's
metadata (:func:`.grpchost.interceptor.guarded`). It sets :data:`OWNER` to the token's
:func:`fingerprint` for the task serving the request; the gRPC bridge carries it over the
hop from asyncio to trio (:func:`.grpchost.bridge.to_trio`), and trio copies it into every
task that task starts. :class:`OwnerStamp`, the engine every door is given, writes it into
each inference request's control record (``RequestControl.owner``), replacing whatever
the client put in the ``sequence_owner`` parameter (which is always removed, and only
honoured when sequences are bound), so it travels to the engine process with the
request's other controls. A request whose door filled no record yet gets it in the
``sequence_owner`` parameter instead, which the engine takes out when it reads the
record (:func:`~actorserve.controls.control_of`): the model never sees it.

The fingerprint travels, never the token: a hash of the token under a label of its own,
so it is no use as a token and is the same in every process.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import AsyncIterator
from typing import Any, Final

import attrs

from ..api import OWNER_PARAMETER, EngineAPI, ResponseStream, control_of
from ..tracing import TRACE
from ..types import InferenceRequest, InferenceResponse
from .auth import Guard
from .httphost.replies import ASGIReceive, ASGIScope, ASGISend

#: The fingerprint of the token of the request this task serves (None: no valid token).
OWNER: Final = contextvars.ContextVar[str | None]("actorserve_sequence_owner", default=None)

_LABEL: Final = b"actorserve sequence owner\0"


def fingerprint(token: bytes) -> str:
    """128 bits of SHA-256 over a label and ``token``, as 32 hex digits."""
    return hashlib.sha256(_LABEL + token).hexdigest()[:32]


def owner_of(guard: Guard, authorization: str | bytes | None) -> str | None:
    """The fingerprint of ``authorization``'s bearer token if ``guard`` accepts it, else None."""
    if authorization is None or not guard.allows(authorization):
        return None
    if isinstance(authorization, str):
        authorization = authorization.encode()
    return fingerprint(authorization.strip().partition(b" ")[2].strip())


class OwnerScope:
    """The REST app ``app`` with :data:`OWNER` set, for each HTTP request, from its
    ``Authorization`` header (the app itself refuses a request without the token)."""

    __slots__ = ("app", "guard")

    def __init__(self, app: Any, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        owner = None
        if scope["type"] == "http":
            for key, value in scope["headers"]:
                if key == b"authorization":
                    owner = owner_of(self.guard, value)
                    break
        reset = OWNER.set(owner)
        try:
            await self.app(scope, receive, send)
        finally:
            OWNER.reset(reset)


class OwnerStamp:
    """``engine`` for the doors: each inference request gets the caller's fingerprint
    as its control record's owner (``bind``), and loses any ``sequence_owner`` a client
    sent. Everything else is ``engine``'s own."""

    def __init__(self, engine: EngineAPI, *, bind: bool) -> None:
        self._engine = engine
        self._bind = bind

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def _stamped(self, request: InferenceRequest, owner: str | None) -> InferenceRequest:
        params = request.parameters
        if OWNER_PARAMETER in params:
            del params[OWNER_PARAMETER]
        if not self._bind:
            owner = None
        control = request.control
        if control is None:  # no record yet: the engine reads the owner with the rest
            if owner is not None:
                params[OWNER_PARAMETER] = owner
        elif control.owner != owner:
            request.control = attrs.evolve(control, owner=owner)
        return request

    async def infer(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> InferenceResponse:
        request = _traced(self._stamped(request, OWNER.get()), TRACE.get())
        pending = self._engine.infer(request, model=model, version=version)
        del request  # held by the call alone: a front drops it once sent (cost bound)
        return await pending

    def infer_stream(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> ResponseStream:
        request = _traced(self._stamped(request, OWNER.get()), TRACE.get())
        return self._engine.infer_stream(request, model=model, version=version)

    def stream(
        self, requests: AsyncIterator[InferenceRequest], *, model: str, version: str | None = None
    ) -> ResponseStream:
        # read now: the requests may be pulled by a task of the engine's
        owner, traced = OWNER.get(), TRACE.get()

        async def stamped() -> AsyncIterator[InferenceRequest]:
            async for request in requests:
                yield _traced(self._stamped(request, owner), traced)

        return self._engine.stream(stamped(), model=model, version=version)


def _traced(request: InferenceRequest, traced: str | None) -> InferenceRequest:
    """``request``, its control record naming the span ``traced`` (tracing on: the
    ``traceparent`` of the request's span at its host), so the engine's spans join it."""
    if traced is not None:
        request.control = attrs.evolve(control_of(request), trace=traced)
    return request


__all__ = ["OWNER", "OwnerScope", "OwnerStamp", "fingerprint", "owner_of"]
