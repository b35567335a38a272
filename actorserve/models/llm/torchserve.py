"""TorchServe's ``/predictions`` body as a request of the ``transformers`` runtime."""

from __future__ import annotations

import json
from typing import Final

import attrs
import numpy as np

from ...errors import BadInput
from ...types import InferenceRequest, Tensor

#: the input TorchServe's ``/predictions`` API passes the body in (``torchserve.envelope.BODY``)
TS_BODY: Final = "body"


def from_torchserve(
    request: InferenceRequest, body: Tensor, model: str, known: frozenset[str]
) -> tuple[InferenceRequest, Tensor]:
    """A request of TorchServe's ``/predictions`` API: its body is the prompt as text,
    or a JSON object with the prompt in ``text_input`` (or ``prompt``) and the request
    parameters beside it (``{"text_input": "Hi", "max_tokens": 8}``)."""
    value = body.data.reshape(-1)[0] if body.datatype == "BYTES" and body.data.size == 1 else b""
    raw = value if isinstance(value, bytes) else str(value).encode()
    parameters = dict(request.parameters)
    if "json" in str(body.parameters.get("content_type", "")) or raw.lstrip()[:1] == b"{":
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise BadInput(f"input 'body': not JSON ({exc})") from None
        key = "text_input" if isinstance(obj, dict) and "text_input" in obj else "prompt"
        if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
            raise BadInput(
                "input 'body': expected text, or a JSON object with a string 'text_input' or 'prompt'"
            )
        prompt = obj.pop(key)
        unknown = sorted(set(obj) - known)
        if unknown:
            raise BadInput(
                f"input 'body': model {model!r} has no parameter {', '.join(map(repr, unknown))}; its "
                f"parameters are: {', '.join(sorted(known))}"
            )
        parameters.update(obj)
        raw = prompt.encode()
    data = np.empty(1, dtype=object)
    data[0] = raw
    return attrs.evolve(request, parameters=parameters), Tensor("text_input", (1,), "BYTES", data)
