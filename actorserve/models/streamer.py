"""``streamer``: streams ``n_tokens`` responses ``<prompt>:<k>``, optionally paced."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import numpy as np
import trio

from ..api import bool_parameter
from ..codecs import tensor_from_numpy
from ..model import Model, float_parameter, int_parameter, text_input
from ..textgen import TextGeneration
from ..types import InferenceRequest, InferenceResponse

MAX_TOKENS = 10_000


def _bytes_array(values: list[bytes]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class StreamerModel(Model):
    """Input ``text_input`` BYTES [1] (default ``tok``); parameters ``n_tokens`` (0-10000,
    default 5) and ``delay`` (seconds before each token, default 0).

    Streaming yields response k with ``text_output`` = ``<prompt>:<k>`` and ``index`` = k;
    unary ``infer`` returns every token at once as ``[n]``-shaped outputs. With parameter
    ``usage: true`` the last response says ``finish_reason`` and the token counts.
    """

    request_parameters: ClassVar[frozenset[str] | None] = frozenset({"n_tokens", "delay", "usage"})
    #: a text generator whose tokens are its responses (``n_tokens`` bounds them)
    text_generation: ClassVar[TextGeneration | None] = TextGeneration(max_tokens="n_tokens", usage=True)

    def _parse(self, request: InferenceRequest) -> tuple[str, int, float]:
        prompt = text_input(request, "text_input", default="tok")
        n_tokens = int_parameter(request, "n_tokens", 5, minimum=0, maximum=MAX_TOKENS)
        delay = float_parameter(request, "delay", 0.0, minimum=0.0, maximum=60.0)
        return prompt, n_tokens, delay

    @staticmethod
    def _usage(request: InferenceRequest, n_tokens: int) -> dict[str, Any]:
        """With ``usage: true``, what the last response's parameters say (the prompt is one
        token, each response one more)."""
        if not bool_parameter(request.parameters.get("usage", False), "usage"):
            return {}
        return {"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": n_tokens}

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            prompt, n_tokens, delay = self._parse(request)
            usage = self._usage(request, n_tokens)
            for k in range(n_tokens):
                if delay:
                    await trio.sleep(delay)
                yield self.response(
                    request,
                    [
                        tensor_from_numpy("text_output", _bytes_array([f"{prompt}:{k}".encode()]), "BYTES"),
                        tensor_from_numpy("index", np.array([k], dtype=np.int64), "INT64"),
                    ],
                    dict(usage) if k == n_tokens - 1 else None,
                )

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        prompt, n_tokens, delay = self._parse(request)
        usage = self._usage(request, n_tokens)
        if delay and n_tokens:
            await trio.sleep(delay * n_tokens)
        return self.response(
            request,
            [
                tensor_from_numpy(
                    "text_output", _bytes_array([f"{prompt}:{k}".encode() for k in range(n_tokens)]), "BYTES"
                ),
                tensor_from_numpy("index", np.arange(n_tokens, dtype=np.int64), "INT64"),
            ],
            usage,
        )
