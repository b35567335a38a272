"""TorchServe's door's part of the port's OpenAPI document (the HTTP host assembles it);
no I/O. Bodies and answers are TorchServe's (docs/torchserve.md)."""

from __future__ import annotations

from functools import partial

from ..httphost.openapi import (
    INFERENCE_AUTH,
    OpenApiPart,
    json_content,
    ok,
    op,
    path_parameter,
    ref,
)


def openapi_part() -> OpenApiPart:
    """TorchServe's inference and management APIs (docs/torchserve.md); their bodies and
    answers are TorchServe's."""
    model = path_parameter("model")
    version = path_parameter("version")
    any_body = {
        "required": False,
        "content": {"application/octet-stream": {"schema": {}}, **json_content({})},
    }
    answer = ok(ref("Object"))
    predict = {
        "post": {
            **op("TorchServe: a prediction", answer, description=INFERENCE_AUTH),
            "requestBody": any_body,
        }
    }
    predict["put"] = predict["post"]
    explain = {
        "post": op("TorchServe: explanations (not implemented: 501)", answer, description=INFERENCE_AUTH)
    }
    manage = partial(op, secured=True)
    one_model = {
        "get": manage("TorchServe: describe a model", answer),
        "put": manage("TorchServe: scale a model (min_worker, max_worker, synchronous)", answer),
        "delete": manage("TorchServe: unregister a model", answer),
    }
    return OpenApiPart(
        {
            "/ping": {"get": op("TorchServe: health", answer)},
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
    )


__all__ = ["openapi_part"]
