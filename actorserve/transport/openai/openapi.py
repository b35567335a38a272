"""The OpenAI door's part of the port's OpenAPI document (the HTTP host assembles it);
no I/O. Bodies and answers are OpenAI's (see its API reference and docs/openai.md)."""

from __future__ import annotations

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


def openapi_part() -> OpenApiPart:
    """The ``/v1`` paths this door serves."""
    paths: Json = {
        "/v1/models": {"get": op("OpenAI API: the models that generate text", ok(ref("Object")))},
        "/v1/models/{model}": {
            "parameters": [path_parameter("model")],
            "get": op("OpenAI API: one model", ok(ref("Object"))),
        },
        "/v1/completions": {
            "post": op(
                "OpenAI API: a completion (stream: true answers server-sent events); see OpenAI's API reference",
                {
                    "200": {"description": "OK", "content": {**json_content(ref("Object")), **EVENT_STREAM}},
                    **ERRORS,
                },
                body=json_content(ref("Object")),
                description=INFERENCE_AUTH,
            )
        },
        "/v1/chat/completions": {
            "post": op(
                "OpenAI API: a chat completion (stream: true answers server-sent events); see OpenAI's API reference",
                {
                    "200": {"description": "OK", "content": {**json_content(ref("Object")), **EVENT_STREAM}},
                    **ERRORS,
                },
                body=json_content(ref("Object")),
                description=INFERENCE_AUTH,
            )
        },
    }
    return OpenApiPart(paths)


__all__ = ["openapi_part"]
