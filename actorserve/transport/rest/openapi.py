"""The OIP door's part of the port's OpenAPI document (the HTTP host assembles it:
:mod:`actorserve.transport.httphost.openapi`), built from this table, no I/O.

Every route the OIP door serves is here; a test compares it with the routes the door
registers, so the two cannot drift. Each model route appears twice, as in the OIP:
``/v2/models/{name}/...`` (the default version) and
``/v2/models/{name}/versions/{version}/...``.
"""

from __future__ import annotations

from typing import Final

from ..httphost.openapi import (
    ERRORS,
    EVENT_STREAM,
    INFERENCE_AUTH,
    Json,
    OpenApiPart,
    json_content,
    ok,
    op,
    path_parameter,
    ref,
)

_SSE: Final = {
    "description": "server-sent events: one `data:` event per response; an `event: error` ends a failed stream",
    "content": EVENT_STREAM,
}
_SEQUENCE_HEADERS: Final = [
    {"name": h, "in": "header", "required": False, "schema": {"type": "string"}, "description": d}
    for h, d in (
        ("sequence-id", "the request's sequence (as parameter sequence_id)"),
        ("sequence-start", "true: start the sequence"),
        ("sequence-end", "true: end the sequence after this request"),
    )
]


_NAME: Final = path_parameter("name")
_VERSION: Final = path_parameter("version")
_INFER_BODY: Final = {
    **json_content(ref("InferenceRequest")),
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},  # Triton's binary tensors
}
_GENERATE_BODY: Final = json_content({"oneOf": [ref("GenerateRequest"), ref("InferenceRequest")]})


def _model_paths() -> Json:
    ops: dict[str, Json] = {
        "": {"get": op("Model metadata", ok(ref("ModelMetadata")))},
        "/ready": {"get": op("Model readiness", ok(ref("ModelReady")))},
        "/config": {
            "get": op(
                "Triton's model configuration (inputs, outputs, batching, instances)", ok(ref("Object"))
            )
        },
        "/stats": {"get": op("Triton's inference statistics of the model", ok(ref("Object")))},
        "/infer": {
            "post": op(
                "Inference",
                ok(ref("InferenceResponse")),
                body=_INFER_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=INFERENCE_AUTH,
            )
        },
        "/infer_stream": {
            "post": op(
                "Streaming inference",
                {"200": _SSE, **ERRORS},
                body=_INFER_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=INFERENCE_AUTH,
            )
        },
        "/generate": {
            "post": op(
                "Generate (Triton's generate extension, or OIP tensors)",
                ok({"oneOf": [ref("GenerateResponse"), ref("InferenceResponse")]}),
                body=_GENERATE_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=INFERENCE_AUTH,
            )
        },
        "/generate_stream": {
            "post": op(
                "Streaming generate",
                {"200": _SSE, **ERRORS},
                body=_GENERATE_BODY,
                parameters=_SEQUENCE_HEADERS,
                description=INFERENCE_AUTH,
            ),
            "get": op(
                "Streaming generate for EventSource: every query parameter is an input (text_input=...); "
                "the stream ends with `event: end`",
                {"200": _SSE, **ERRORS},
                parameters=[
                    {"name": "text_input", "in": "query", "required": False, "schema": {"type": "string"}}
                ],
                description=INFERENCE_AUTH,
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
                "inputs": {"type": "array", "items": ref("MetadataTensor")},
                "outputs": {"type": "array", "items": ref("MetadataTensor")},
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
                "parameters": ref("Parameters"),
                "data": tensor_data,
            },
        },
        "RequestOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": ref("Parameters")},
        },
        "InferenceRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": ref("Parameters"),
                "inputs": {"type": "array", "items": ref("RequestInput")},
                "outputs": {"type": "array", "items": ref("RequestOutput")},
            },
        },
        "ResponseOutput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "datatype": {"type": "string"},
                "parameters": ref("Parameters"),
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
                "parameters": ref("Parameters"),
                "outputs": {"type": "array", "items": ref("ResponseOutput")},
            },
        },
        "GenerateRequest": {
            "type": "object",
            "description": "Triton's generate request: every top-level key but id and parameters is an input",
            "properties": {"id": {"type": "string"}, "text_input": {}, "parameters": ref("Parameters")},
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
        "RepositoryRequest": {"type": "object", "properties": {"parameters": ref("Parameters")}},
        "Empty": {"type": "object"},
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


def openapi_part() -> OpenApiPart:
    """The OIP door's paths and schemas."""
    index_body = {"required": False, "content": json_content(ref("RepositoryIndexRequest"))}
    repository_body = {"required": False, "content": json_content(ref("RepositoryRequest"))}
    paths: Json = {
        "/v2/health/live": {"get": op("Server liveness", ok(ref("Live")))},
        "/v2/health/ready": {"get": op("Server readiness", ok(ref("Ready")))},
        "/v2": {"get": op("Server metadata", ok(ref("ServerMetadata")))},
        "/v2/": {"get": op("Server metadata (same as /v2)", ok(ref("ServerMetadata")))},
        **_model_paths(),
        "/v2/repository/index": {
            "get": op("Every model version and its state", ok(ref("RepositoryIndex"))),
            "post": {
                **op("Every model version and its state", ok(ref("RepositoryIndex"))),
                "requestBody": index_body,
            },
        },
        "/v2/models/stats": {"get": op("Triton's inference statistics of every model", ok(ref("Object")))},
        "/v2/repository/models/{name}": {
            "parameters": [_NAME],
            "get": op(
                "Describe a model: workers, batching, sequences, queue depths, state",
                ok(ref("Object")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/versions/{version}": {
            "parameters": [_NAME, _VERSION],
            "get": op("Describe a model version", ok(ref("Object")), secured=True),
        },
        "/v2/repository/models/{name}/workers": {
            "parameters": [_NAME],
            "post": op(
                "Set the number of workers (replicas) at run time",
                ok(ref("Object")),
                body=json_content(ref("Workers")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/versions/{version}/workers": {
            "parameters": [_NAME, _VERSION],
            "post": op(
                "Set the number of workers of one version",
                ok(ref("Object")),
                body=json_content(ref("Workers")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/default_version": {
            "parameters": [_NAME],
            "post": op(
                "Set the version served when a request names none",
                ok(ref("Object")),
                body=json_content(ref("DefaultVersion")),
                secured=True,
            ),
        },
        "/v2/repository/models/{name}/load": {
            "parameters": [_NAME],
            "post": {
                **op("(Re)load a model from the model repository", ok(ref("Empty")), secured=True),
                "requestBody": repository_body,
            },
        },
        "/v2/repository/models/{name}/unload": {
            "parameters": [_NAME],
            "post": {
                **op(
                    "Unload a model (in-flight requests get the grace period)",
                    ok(ref("Empty")),
                    secured=True,
                ),
                "requestBody": repository_body,
            },
        },
    }
    return OpenApiPart(paths, _schemas())


__all__ = ["openapi_part"]
