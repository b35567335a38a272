"""Bearer-token auth, for every transport: which routes need a token, and the check.

No I/O here (the token file is read by :func:`actorserve.auth.server_tokens`). What is
protected is decided by route prefix and gRPC service, so routes added later under the
same prefix are covered without a change here:

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

#: REST paths under this prefix are management routes.
MANAGEMENT_PREFIX: Final = "/v2/repository/models/"
#: TorchServe's management paths: ``/models`` and everything under it.
TORCHSERVE_MANAGEMENT: Final = "/models"
#: TorchServe's inference paths (``/ping`` is health: open).
TORCHSERVE_INFERENCE_PREFIXES: Final = ("/predictions/", "/explanations/")
#: gRPC methods (``/package.Service/Method``) with these prefixes are management methods.
GRPC_MANAGEMENT_PREFIXES: Final = (
    "/inference.GRPCInferenceService/RepositoryModel",
    "/actorserve.v1.Management/",
    "/org.pytorch.serve.grpc.management.ManagementAPIsService/",
)
#: gRPC inference methods, and services all of whose methods are inference (but Ping).
GRPC_INFERENCE: Final = frozenset({"/inference.GRPCInferenceService/ModelInfer", "/inference.GRPCInferenceService/ModelStreamInfer"})
GRPC_INFERENCE_PREFIXES: Final = ("/org.pytorch.serve.grpc.inference.InferenceAPIsService/",)
GRPC_OPEN: Final = frozenset({"/org.pytorch.serve.grpc.inference.InferenceAPIsService/Ping"})
#: REST model operations that are inference.
INFERENCE_OPS: Final = frozenset({"infer", "infer_stream", "generate", "generate_stream"})
#: the OpenAI API's inference routes (``/v1/models`` is metadata: open)
OPENAI_INFERENCE: Final = frozenset({"/v1/completions", "/v1/chat/completions"})
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
        self, tokens: Iterable[str], *, management: bool = True, inference: bool = False, metrics: bool = False
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

    def rest_scope(self, path: str, inference_op: bool) -> Scope | None:
        """The scope a REST request needs (None: open). ``inference_op``: the path is a
        model's infer / generate route (the caller matched it already)."""
        if inference_op or path in OPENAI_INFERENCE or path.startswith(TORCHSERVE_INFERENCE_PREFIXES):
            return Scope.INFERENCE if self.inference else None
        if path.startswith(MANAGEMENT_PREFIX) or path == TORCHSERVE_MANAGEMENT or path.startswith("/models/"):
            return Scope.MANAGEMENT if self.management else None
        if path == METRICS_PATH:
            return Scope.METRICS if self.metrics else None
        return None

    def grpc_scope(self, method: str) -> Scope | None:
        """The scope a gRPC method (``/package.Service/Method``) needs (None: open)."""
        if method in GRPC_OPEN:
            return None
        if method in GRPC_INFERENCE or method.startswith(GRPC_INFERENCE_PREFIXES):
            return Scope.INFERENCE if self.inference else None
        if method.startswith(GRPC_MANAGEMENT_PREFIXES):
            return Scope.MANAGEMENT if self.management else None
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
    "GRPC_INFERENCE",
    "GRPC_MANAGEMENT_PREFIXES",
    "INFERENCE_OPS",
    "MANAGEMENT_PREFIX",
    "METRICS_PATH",
    "OPENAI_INFERENCE",
    "UNAUTHORIZED",
    "Guard",
    "Scope",
]
