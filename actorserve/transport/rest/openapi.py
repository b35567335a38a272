"""The OpenAPI 3.1 document of the REST API (``GET /v2/docs/dataplane.json``), built
from this table, no I/O.

Every route the REST app serves is here but the playground's page and files; a test
compares the document with the routes the app registers, so the two cannot drift. Each
model route appears twice, as in the OIP: ``/v2/models/{name}/...`` (the default
version) and ``/v2/models/{name}/versions/{version}/...``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from ...version import __version__

DOCUMENT_PATH: Final = "/v2/docs/dataplane.json"

Json = dict[str, Any]


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Json) -> Json:
    return {"application/json": {"schema": schema}}


_ERROR = {"description": "error", "content": _json(_ref("Error"))}
_ERRORS: Final = {str(code): _ERROR for code in (400, 404, 408, 409, 413, 429, 500, 503)}
_UNAUTHORIZED: Final = {
    "401": {"description": "missing or wrong bearer token", "content": _json(_ref("Error"))}
}
_EVENT_STREAM: Final[Json] = {"text/event-stream": {"schema": {"type": "string"}}}
_SSE: Final = {
    "description": "server-sent events: one `data:` event per response; an `event: error` ends a failed stream",
    "content": _EVENT_STREAM,
}
_SEQUENCE_HEADERS: Final = [
    {"name": h, "in": "header", "required": False, "schema": {"type": "string"}, "description": d}
    for h, d in (
        ("sequence-id", "the request's sequence (as parameter sequence_id)"),
        ("sequence-start", "true: start the sequence"),
        ("sequence-end", "true: end the sequence after this request"),
    )
]


def _op(
    summary: str, responses: Json, *, body: Json | None = None, secured: bool = False, **extra: Any
) -> Json:
    op: Json = {"summary": summary, "responses": {**responses, **(_UNAUTHORIZED if secured else {})}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    if secured:
        op["security"] = [{"bearerAuth": []}]
    op.update(extra)
    return op


def _ok(schema: Json, description: str = "OK") -> Json:
    return {"200": {"description": description, "content": _json(schema)}, **_ERRORS}


_NAME: Final = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION: Final = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
_INFER_BODY: Final = {
    **_json(_ref("InferenceRequest")),
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},  # Triton's binary tensors
}
_GENERATE_BODY: Final = _json({"oneOf": [_ref("GenerateRequest"), _ref("InferenceRequest")]})
_INFERENCE_AUTH: Final = "needs a bearer token only when the server runs with --auth-inference"


def _model_paths() -> Json:
    ops: dict[str, Json] = {
        "": {"get": _op("Model metadata", _ok(_ref("ModelMetadata")))},
        "/ready": {"get": _op("Model readiness", _ok(_ref("ModelReady")))},
        "/config": {
            "get": _op(
                "Triton's model configuration (inputs, outputs, batching, instances)", _ok(_ref("Object"))
            )
        },
        "/stats": {"get": _op("Triton's inference statistics of the model", _ok(_ref("Object")))},
        "/infer": {
            "post": _op(
                "Inference",
                _ok(_ref("InferenceResponse")),
                body=_INFER_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=_INFERENCE_AUTH,
            )
        },
        "/infer_stream": {
            "post": _op(
                "Streaming inference",
                {"200": _SSE, **_ERRORS},
                body=_INFER_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=_INFERENCE_AUTH,
            )
        },
        "/generate": {
            "post": _op(
                "Generate (Triton's generate extension, or OIP tensors)",
                _ok({"oneOf": [_ref("GenerateResponse"), _ref("InferenceResponse")]}),
                body=_GENERATE_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=_INFERENCE_AUTH,
            )
        },
        "/generate_stream": {
            "post": _op(
                "Streaming generate",
                {"200": _SSE, **_ERRORS},
                body=_GENERATE_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=_INFERENCE_AUTH,
            ),
            "get": _op(
                "Streaming generate for EventSource: every query parameter is an input (text_input=...); "
                "the stream ends with `event: end`",
                {"200": _SSE, **_ERRORS},
                parameters=[
                    {"name": "text_input", "in": "query", "required": False, "schema": {"type": "string"}}
                ],
                description=_INFERENCE_AUTH,
            ),
        },
    }
    paths: Json = {}
    for suffix, methods in ops.items():
        paths[f"/v2/models/{{name}}{suffix}"] = {"parameters": [_NAME], **methods}
        paths[f"/v2/models/{{name}}/versions/{{version}}{suffix}"] = {
            "parameters": [_NAME, _VERSION],
            **methods,
        }
    return paths


def _schemas() -> Json:
    parameters: Json = {"type": "object", "additionalProperties": True}
    tensor_data: Json = {"description": "row-major values (nested lists are flattened)"}
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "Parameters": parameters,
        "MetadataTensor": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("MetadataTensor")},
                "outputs": {"type": "array", "items": _ref("MetadataTensor")},
                "parameters": {
                    "type": "object",
                    "description": "what the model declares about its requests (docs/rest.md)",
                    "additionalProperties": {"type": ["string", "boolean"]},
                },
            },
        },
        "ModelReady": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "ready": {"type": "boolean"},
            },
        },
        "Live": {"type": "object", "properties": {"live": {"type": "boolean"}}},
        "Ready": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        "RequestInput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "datatype": {"type": "string"},
                "parameters": _ref("Parameters"),
                "data": tensor_data,
            },
        },
        "RequestOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": _ref("Parameters")},
        },
        "InferenceRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": _ref("Parameters"),
                "inputs": {"type": "array", "items": _ref("RequestInput")},
                "outputs": {"type": "array", "items": _ref("RequestOutput")},
            },
        },
        "ResponseOutput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "datatype": {"type": "string"},
                "parameters": _ref("Parameters"),
                "data": tensor_data,
            },
        },
        "InferenceResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "parameters": _ref("Parameters"),
                "outputs": {"type": "array", "items": _ref("ResponseOutput")},
            },
        },
        "GenerateRequest": {
            "type": "object",
            "description": "Triton's generate request: every top-level key but id and parameters is an input",
            "properties": {"id": {"type": "string"}, "text_input": {}, "parameters": _ref("Parameters")},
            "additionalProperties": True,
        },
        "GenerateResponse": {
            "type": "object",
            "required": ["model_name"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "text_output": {},
            },
            "additionalProperties": True,
        },
        "RepositoryIndexRequest": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        "RepositoryIndex": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "state"],
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "state": {"type": "string", "enum": ["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]},
                    "reason": {"type": "string"},
                },
            },
        },
        "RepositoryRequest": {"type": "object", "properties": {"parameters": _ref("Parameters")}},
        "Empty": {"type": "object"},
        "Object": {"type": "object", "additionalProperties": True},
        "Workers": {
            "type": "object",
            "required": ["workers"],
            "properties": {"workers": {"type": "integer"}},
        },
        "DefaultVersion": {
            "type": "object",
            "required": ["version"],
            "properties": {"version": {"type": "string"}},
        },
    }


def _torchserve_paths() -> Json:
    """TorchServe's inference and management APIs (docs/torchserve.md); their bodies and
    answers are TorchServe's."""
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    version = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
    any_body = {"required": False, "content": {"application/octet-stream": {"schema": {}}, **_json({})}}
    answer = _ok(_ref("Object"))
    predict = {
        "post": {
            **_op("TorchServe: a prediction", answer, description=_INFERENCE_AUTH),
            "requestBody": any_body,
        }
    }
    predict["put"] = predict["post"]
    explain = {
        "post": _op("TorchServe: explanations (not implemented: 501)", answer, description=_INFERENCE_AUTH)
    }
    manage = partial(_op, secured=True)
    one_model = {
        "get": manage("TorchServe: describe a model", answer),
        "put": manage("TorchServe: scale a model (min_worker, max_worker, synchronous)", answer),
        "delete": manage("TorchServe: unregister a model", answer),
    }
    return {
        "/ping": {"get": _op("TorchServe: health", answer)},
        "/predictions/{model}": {"parameters": [model], **predict},
        "/predictions/{model}/{version}": {"parameters": [model, version], **predict},
        "/explanations/{model}": {"parameters": [model], **explain},
        "/explanations/{model}/{version}": {"parameters": [model, version], **explain},
        "/models": {
            "get": manage("TorchServe: list the models", answer),
            "post": manage("TorchServe: register a model (url=..., a .mar archive)", answer),
        },
        "/models/{model}": {"parameters": [model], **one_model},
        "/models/{model}/{version}": {"parameters": [model, version], **one_model},
        "/models/{model}/{version}/set-default": {
            "parameters": [model, version],
            "put": manage("TorchServe: set the default version", answer),
        },
    }


def openapi_document() -> Json:
    """The document (a fresh dict: the caller may serialize it once and keep the bytes)."""
    index_body = {"required": False, "content": _json(_ref("RepositoryIndexRequest"))}
    repository_body = {"required": False, "content": _json(_ref("RepositoryRequest"))}
    paths: Json = {
        "/v2/health/live": {"get": _op("Server liveness", _ok(_ref("Live")))},
        "/v2/health/ready": {"get": _op("Server readiness", _ok(_ref("Ready")))},
        "/v2": {"get": _op("Server metadata", _ok(_ref("ServerMetadata")))},
        "/v2/": {"get": _op("Server metadata (same as /v2)", _ok(_ref("ServerMetadata")))},
        **_model_paths(),
        "/v2/repository/index": {
            "get": _op("Every model version and its state", _ok(_ref("RepositoryIndex"))),
            "post": {
                **_op("Every model version and its state", _ok(_ref("RepositoryIndex"))),
                "requestBody": index_body,
            },
        },
        "/v2/models/stats": {"get": _op("Triton's inference statistics of every model", _ok(_ref("Object")))},
        "/v2/repository/models/{name}": {
            "parameters": [_NAME],
            "get": _op(
                "Describe a model: workers, batching, sequences, queue depths, state",
                _ok(_ref("Object")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/versions/{version}": {
            "parameters": [_NAME, _VERSION],
            "get": _op("Describe a model version", _ok(_ref("Object")), secured=True),
        },
        "/v2/repository/models/{name}/workers": {
            "parameters": [_NAME],
            "post": _op(
                "Set the number of workers (replicas) at run time",
                _ok(_ref("Object")),
                body=_json(_ref("Workers")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/versions/{version}/workers": {
            "parameters": [_NAME, _VERSION],
            "post": _op(
                "Set the number of workers of one version",
                _ok(_ref("Object")),
                body=_json(_ref("Workers")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/default_version": {
            "parameters": [_NAME],
            "post": _op(
                "Set the version served when a request names none",
                _ok(_ref("Object")),
                body=_json(_ref("DefaultVersion")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/load": {
            "parameters": [_NAME],
            "post": {
                **_op("(Re)load a model from the model repository", _ok(_ref("Empty")), secured=True),
                "requestBody": repository_body,
            },
        },
        "/v2/repository/models/{name}/unload": {
            "parameters": [_NAME],
            "post": {
                **_op(
                    "Unload a model (in-flight requests get the grace period)",
                    _ok(_ref("Empty")),
                    secured=True,
                ),
                "requestBody": repository_body,
            },
        },
        "/v1/models": {"get": _op("OpenAI API: the models that generate text", _ok(_ref("Object")))},
        "/v1/models/{model}": {
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            "get": _op("OpenAI API: one model", _ok(_ref("Object"))),
        },
        "/v1/completions": {
            "post": _op(
                "OpenAI API: a completion (stream: true answers server-sent events); see OpenAI's API reference",
                {
                    "200": {"description": "OK", "content": {**_json(_ref("Object")), **_EVENT_STREAM}},
                    **_ERRORS,
                },
                body=_json(_ref("Object")),
                description=_INFERENCE_AUTH,
            )
        },
        "/v1/chat/completions": {
            "post": _op(
                "OpenAI API: a chat completion (stream: true answers server-sent events); see OpenAI's API reference",
                {
                    "200": {"description": "OK", "content": {**_json(_ref("Object")), **_EVENT_STREAM}},
                    **_ERRORS,
                },
                body=_json(_ref("Object")),
                description=_INFERENCE_AUTH,
            )
        },
        **_torchserve_paths(),
        "/metrics": {
            "get": _op(
                "Prometheus metrics (text exposition format; docs/metrics.md); a bearer token only with --auth-metrics",
                {"200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}},
            )
        },
        DOCUMENT_PATH: {
            "get": _op("This document", {"200": {"description": "OK", "content": _json({"type": "object"})}})
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "actorserve REST API",
            "version": __version__,
            "description": "Open Inference Protocol (KServe V2) data plane, Triton's generate extension, the "
            "model repository extension, the OpenAI API (/v1), TorchServe's APIs and actorserve's own routes.",
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }


__all__ = ["DOCUMENT_PATH", "openapi_document"]
