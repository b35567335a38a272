"""Bearer-token auth, for every transport: which routes need a token, and the check.

No I/O here (the token file is read by :func:`actorserve.server.tokens.server_tokens`). Which
scope a request is in is said by the door that owns its path or gRPC method (each door's
``auth_scope``, asked by the HTTP and gRPC hosts), for REST on the one canonical path
(:mod:`actorserve.transport.httphost.target`) that also routes it, after the door's own
normalisation (the OpenAI door's trailing ``/``); doors classify by prefix and service, so
routes or methods added later under the same prefix are covered. The guard is the one
table of which scope needs a token (:meth:`Guard.needs`). Today's doors say:

- management (unless ``--no-auth``): REST every path under ``/v2/repository/models/``
  (load, unload and whatever else is added there) and TorchServe's ``/models`` paths,
  gRPC every method of ``inference.GRPCInferenceService`` whose name starts with
  ``RepositoryModel`` and every method of the ``actorserve.v1.Management`` and
  TorchServe's ``ManagementAPIsService`` services;
- inference (only with ``--auth-inference``): REST ``infer``, ``infer_stream``,
  ``generate``, ``generate_stream`` of every model and the OpenAI API's
  ``/v1/completions`` and ``/v1/chat/completions``, TorchServe's ``/predictions/...`` and
  ``/explanations/...``; gRPC ``ModelInfer``, ``ModelStreamInfer`` and every method of
  TorchServe's ``InferenceAPIsService`` but ``Ping``;
- metrics (only with ``--auth-metrics``): ``GET /metrics``.

Health, server and model metadata, the repository index, the OpenAPI document and the
playground page stay open. A request without an accepted token gets 401 with
``WWW-Authenticate: Bearer`` (gRPC: UNAUTHENTICATED), and never a word on why.

Each token has a scope (:data:`TOKEN_SCOPES`): a management token may do everything, an
inference token only what :data:`GRANTS` says (inference and metrics); an accepted token
on a route its scope does not cover gets 403 (gRPC: PERMISSION_DENIED), on every door and
both transports, since both hosts ask :meth:`Guard.verdict`.
Tokens are compared in constant time (:func:`hmac.compare_digest`), against every
accepted token each time.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Mapping
from typing import Final

#: the REST path of the metrics (``--auth-metrics``)
METRICS_PATH: Final = "/metrics"

#: what a client without the right token is told (REST body, gRPC message).
UNAUTHORIZED: Final = "unauthorized"
CHALLENGE: Final = ("WWW-Authenticate", "Bearer")


#: request headers that carry a client's credentials (lower case): the front uses the
#: token and drops them all before anything reaches the engine, so no model (a
#: TorchServe handler sees its request's headers) ever holds a client's secret
CREDENTIAL_HEADERS: Final = frozenset(
    {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token"}
)


def without_credentials(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` less every one of :data:`CREDENTIAL_HEADERS` (names in any case)."""
    return {key: value for key, value in headers.items() if key.lower() not in CREDENTIAL_HEADERS}


class Scope(enum.Enum):
    """What a route is (as its door says), and what a token may do (a token's scope is
    :attr:`MANAGEMENT` or :attr:`INFERENCE`)."""

    MANAGEMENT = "management"
    INFERENCE = "inference"
    METRICS = "metrics"


#: the scopes a token may be given (``<token> <scope>`` in a token file)
TOKEN_SCOPES: Final = (Scope.MANAGEMENT, Scope.INFERENCE)

#: a token's scope -> the route scopes it opens: a management token may do everything, an
#: inference token may infer and read the metrics, never load, unload, register or scale
GRANTS: Final = {
    Scope.MANAGEMENT: frozenset(Scope),
    Scope.INFERENCE: frozenset({Scope.INFERENCE, Scope.METRICS}),
}

#: what a client whose token is valid but does not cover the route is told (403 /
#: PERMISSION_DENIED): the token was right, so saying so tells a guesser nothing
FORBIDDEN: Final = (
    "forbidden: this token's scope does not cover this route (an inference token cannot manage models)"
)


class Verdict(enum.Enum):
    """A request's token against the scope its route needs."""

    ALLOWED = "allowed"
    #: no token, or not one of the accepted ones (401 / UNAUTHENTICATED)
    UNAUTHORIZED = "unauthorized"
    #: an accepted token whose scope does not cover the route (403 / PERMISSION_DENIED)
    FORBIDDEN = "forbidden"


class Guard:
    """Which requests need a token, and what a request's ``Authorization`` value may do.

    ``tokens``: each accepted token with its scope (a bare string: a management token).
    ``management=False`` is ``--no-auth``."""

    __slots__ = ("_tokens", "inference", "management", "metrics")

    def __init__(
        self,
        tokens: Iterable[str | tuple[str, Scope]],
        *,
        management: bool = True,
        inference: bool = False,
        metrics: bool = False,
    ) -> None:
        scoped = [(t, Scope.MANAGEMENT) if isinstance(t, str) else t for t in tokens]
        for _, scope in scoped:
            if scope not in TOKEN_SCOPES:
                raise ValueError(f"a token's scope is management or inference, not {scope.value}")
        self._tokens = tuple((t.encode(), scope) for t, scope in scoped if t)
        if (management or inference or metrics) and not self._tokens:
            raise ValueError("auth is on but no token was given")
        self.management = management
        self.inference = inference
        self.metrics = metrics

    @property
    def active(self) -> bool:
        return self.management or self.inference or self.metrics

    def needs(self, scope: Scope | None) -> Scope | None:
        """The scope a request in ``scope`` (as its door classified it; None: open) must
        hold a token for, or None if this server leaves that scope open."""
        if scope is Scope.MANAGEMENT:
            return scope if self.management else None
        if scope is Scope.INFERENCE:
            return scope if self.inference else None
        if scope is Scope.METRICS:
            return scope if self.metrics else None
        return None

    def scope_of(self, authorization: str | bytes | None) -> Scope | None:
        """The scope of the accepted token ``authorization`` carries (``Bearer <token>``),
        or None for no accepted token."""
        if authorization is None:
            return None
        if isinstance(authorization, str):
            try:
                authorization = authorization.encode()
            except UnicodeEncodeError:
                return None
        scheme, _, presented = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        presented = presented.strip()
        found = None
        for token, scope in self._tokens:  # every one, each in constant time
            if hmac.compare_digest(presented, token):
                found = scope
        return found

    def allows(self, authorization: str | bytes | None) -> bool:
        """True if ``authorization`` is ``Bearer <token>`` for an accepted token (of any scope)."""
        return self.scope_of(authorization) is not None

    def verdict(self, needed: Scope, authorization: str | bytes | None) -> Verdict:
        """Whether ``authorization`` may make a request whose route needs ``needed``."""
        scope = self.scope_of(authorization)
        if scope is None:
            return Verdict.UNAUTHORIZED
        return Verdict.ALLOWED if needed in GRANTS[scope] else Verdict.FORBIDDEN


__all__ = [
    "CHALLENGE",
    "CREDENTIAL_HEADERS",
    "FORBIDDEN",
    "GRANTS",
    "TOKEN_SCOPES",
    "METRICS_PATH",
    "UNAUTHORIZED",
    "Guard",
    "Scope",
    "Verdict",
    "without_credentials",
]
