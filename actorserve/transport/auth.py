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
playground page stay open. A request without the right token gets 401 with
``WWW-Authenticate: Bearer`` (gRPC: UNAUTHENTICATED), and never a word on why.
Tokens are compared in constant time (:func:`hmac.compare_digest`), against every
accepted token each time.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable
from typing import Final

#: the REST path of the metrics (``--auth-metrics``)
METRICS_PATH: Final = "/metrics"

#: what a client without the right token is told (REST body, gRPC message).
UNAUTHORIZED: Final = "unauthorized"
CHALLENGE: Final = ("WWW-Authenticate", "Bearer")


class Scope(enum.Enum):
    MANAGEMENT = "management"
    INFERENCE = "inference"
    METRICS = "metrics"


class Guard:
    """Which requests need a token, and whether a request's ``Authorization`` value
    carries one of ``tokens``. ``management=False`` is ``--no-auth``."""

    __slots__ = ("_tokens", "inference", "management", "metrics")

    def __init__(
        self,
        tokens: Iterable[str],
        *,
        management: bool = True,
        inference: bool = False,
        metrics: bool = False,
    ) -> None:
        self._tokens = tuple(t.encode() for t in tokens if t)
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

    def allows(self, authorization: str | bytes | None) -> bool:
        """True if ``authorization`` is ``Bearer <token>`` for an accepted token."""
        if authorization is None:
            return False
        if isinstance(authorization, str):
            try:
                authorization = authorization.encode()
            except UnicodeEncodeError:
                return False
        scheme, _, presented = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        presented = presented.strip()
        ok = False
        for token in self._tokens:  # every one, each in constant time
            ok |= hmac.compare_digest(presented, token)
        return ok


__all__ = [
    "CHALLENGE",
    "METRICS_PATH",
    "UNAUTHORIZED",
    "Guard",
    "Scope",
]
