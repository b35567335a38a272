"""The OpenAPI 3.1 document of a REST port (``GET /v2/docs/dataplane.json``), assembled
by the HTTP host from what each door declares (:meth:`HttpDoor.openapi
<actorserve.transport.httphost.door.HttpDoor.openapi>`), and the kit the doors write
their parts with. No I/O.

A door owns its paths, so it documents them: a new door's routes are in the document the
moment the server lists the door, with no other file touched. The host adds its own
routes (``/metrics``, this document) and the schemas every door shares (``Error``,
``Object``); a door's part may add schemas of its own (a name two parts define
differently is a bug, refused when the document is built).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ...version import __version__

DOCUMENT_PATH: Final = "/v2/docs/dataplane.json"

Json = dict[str, Any]


@attrs.frozen
class OpenApiPart:
    """What one door adds to the document: its ``paths`` (path template -> path item)
    and the ``schemas`` they refer to beyond the shared ones."""

    paths: Mapping[str, Json]
    schemas: Mapping[str, Json] = attrs.field(factory=dict)


def ref(name: str) -> Json:
    """A reference to the schema ``name`` (a door's or a shared one)."""
    return {"$ref": f"#/components/schemas/{name}"}


def json_content(schema: Json) -> Json:
    return {"application/json": {"schema": schema}}


_ERROR: Final = {"description": "error", "content": json_content(ref("Error"))}
#: the refusals any operation may answer with; 408 and 413 are a body's (read_timeout,
#: max_body_bytes), the rest the error table's (transport/errors.py)
ERRORS: Final = {str(code): _ERROR for code in (400, 404, 408, 409, 413, 429, 500, 503)}
_UNAUTHORIZED: Final = {
    "401": {"description": "missing or wrong bearer token", "content": json_content(ref("Error"))}
}
EVENT_STREAM: Final[Json] = {"text/event-stream": {"schema": {"type": "string"}}}
INFERENCE_AUTH: Final = "needs a bearer token only when the server runs with --auth-inference"


def op(
    summary: str, responses: Json, *, body: Json | None = None, secured: bool = False, **extra: Any
) -> Json:
    """One operation: ``secured`` ones need a bearer token (and may answer 401)."""
    operation: Json = {"summary": summary, "responses": {**responses, **(_UNAUTHORIZED if secured else {})}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": body}
    if secured:
        operation["security"] = [{"bearerAuth": []}]
    operation.update(extra)
    return operation


def ok(schema: Json, description: str = "OK") -> Json:
    """A 200 answering ``schema`` as JSON, and the shared refusals."""
    return {"200": {"description": description, "content": json_content(schema)}, **ERRORS}


def path_parameter(name: str) -> Json:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


#: the schemas every door may refer to
SHARED_SCHEMAS: Final[Mapping[str, Json]] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "Object": {"type": "object", "additionalProperties": True},
}


def host_part(*, own_routes: bool) -> OpenApiPart:
    """The host's own routes, ``/metrics`` and the document, when the port serves them
    (a port of one door alone, TorchServe's management port, leaves them to the door)."""
    if not own_routes:
        return OpenApiPart({})
    text = {"text/plain": {"schema": {"type": "string"}}}
    return OpenApiPart(
        {
            DOCUMENT_PATH: {
                "get": op(
                    "This document",
                    {"200": {"description": "OK", "content": json_content({"type": "object"})}},
                )
            },
            "/metrics": {
                "get": op(
                    "Prometheus metrics (text exposition format; docs/metrics.md); "
                    "a bearer token only with --auth-metrics",
                    {"200": {"description": "OK", "content": text}},
                )
            },
        }
    )


def document(parts: Iterable[OpenApiPart]) -> Json:
    """The whole document of a port whose doors (and host) declared ``parts``, in order (a
    fresh dict: the caller may serialize it once and keep the bytes). Two parts that
    document the same path, or define one schema differently, are a bug: ValueError."""
    paths: Json = {}
    schemas: Json = dict(SHARED_SCHEMAS)
    for part in parts:
        for path, item in part.paths.items():
            if path in paths:
                raise ValueError(f"two doors document {path}")
            paths[path] = item
        for name, schema in part.schemas.items():
            if schemas.setdefault(name, schema) != schema:
                raise ValueError(f"two doors define the schema {name} differently")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "actorserve REST API",
            "version": __version__,
            "description": "Every door of this port: the Open Inference Protocol (KServe V2) data plane, "
            "Triton's generate extension, the model repository extension, the OpenAI API (/v1), "
            "TorchServe's APIs and actorserve's own routes.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }


__all__ = [
    "DOCUMENT_PATH",
    "ERRORS",
    "EVENT_STREAM",
    "INFERENCE_AUTH",
    "SHARED_SCHEMAS",
    "Json",
    "OpenApiPart",
    "document",
    "host_part",
    "json_content",
    "ok",
    "op",
    "path_parameter",
    "ref",
]
