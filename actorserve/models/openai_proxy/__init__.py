"""The OpenAI-proxy runtime: a model whose answers come from an upstream
OpenAI-compatible server (OpenAI, vLLM, another actorserve, ...), Seldon's ``openai``
runtime in actorserve's shape.

``model-settings.json``::

    {"name": "gpt", "implementation": "actorserve.models.openai_proxy.OpenAIProxyModel",
     "parameters": {"extra": {"base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
                              "api_type": "chat", "api_key_env": "OPENAI_API_KEY", "timeout": 60}}}

Input ``text_input`` BYTES [1] (the prompt; for ``api_type: chat`` the user message);
output ``text_output`` BYTES [1]. ``infer`` and ``generate`` make one upstream request
and answer with the whole text; ``infer_stream`` and ``generate_stream`` stream it piece
by piece as the upstream sends it, then a last response (text "" ) whose parameters say
``finish_reason`` and, with ``usage: true``, the upstream's token counts. Request
parameters ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop`` are passed on.

The API key is read from the environment variable that ``api_key_env`` names, at load,
and is never logged. Errors: see :mod:`.upstream`. Cancelling a request (a client that
disconnects) closes its upstream request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import numpy as np

from ...api import bool_parameter
from ...errors import BadInput
from ...model import Model, text_input
from ...textgen import TextGeneration
from ...types import InferenceRequest, InferenceResponse, Tensor
from .upstream import Reply, UpstreamConfig, complete, request_body, stream

_PASSED_ON = ("max_tokens", "temperature", "top_p", "seed", "stop")


def _text(value: str) -> Tensor:
    data = np.empty(1, dtype=object)
    data[0] = value.encode()
    return Tensor("text_output", (1,), "BYTES", data)


class OpenAIProxyModel(Model):
    """See the module docstring."""

    request_parameters: ClassVar[frozenset[str] | None] = frozenset({*_PASSED_ON, "usage"})
    text_generation: ClassVar[TextGeneration | None] = TextGeneration(
        sampling=("temperature", "top_p", "seed"), stop=True, usage=True
    )

    #: none: ``extra`` names the upstream URL and the variable holding its key (a load that
    #: changed them would make the server POST anywhere, with any variable as the key)
    overridable_parameters: ClassVar[frozenset[str]] = frozenset()

    async def load(self) -> None:
        self.upstream = UpstreamConfig.from_parameters(self.name, self.parameters)

    def _client(self) -> httpx.AsyncClient:
        # one client per request: closing it is what closes the upstream connection
        return httpx.AsyncClient(timeout=self.upstream.timeout)

    def _options(self, request: InferenceRequest) -> tuple[str, dict[str, Any], bool]:
        prompt = text_input(request, "text_input", default="")
        options = {k: request.parameters[k] for k in _PASSED_ON if request.parameters.get(k) is not None}
        stop = options.get("stop")
        if stop is not None and not (
            isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
        ):
            raise BadInput(f"parameter 'stop': expected a string or a list of strings, got {stop!r}")
        usage = bool_parameter(request.parameters.get("usage", False), "usage")
        return prompt, options, usage

    def _last(self, request: InferenceRequest, text: str, reply: Reply, usage: bool) -> InferenceResponse:
        parameters: dict[str, Any] = {"finish_reason": reply.finish_reason or "stop"}
        if usage and reply.usage is not None:
            parameters.update(reply.usage)
        return self.response(request, [_text(text)], parameters)

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        prompt, options, usage = self._options(request)
        body = request_body(self.upstream, prompt, options, stream=False, usage=usage)
        reply = Reply()
        async with self._client() as client:
            text = await complete(client, self.upstream, body, reply)
        return self._last(request, text, reply, usage)

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            prompt, options, usage = self._options(request)
            body = request_body(self.upstream, prompt, options, stream=True, usage=usage)
            reply = Reply()
            async with self._client() as client:
                pieces = stream(client, self.upstream, body, reply)
                try:
                    async for piece in pieces:
                        yield self.response(request, [_text(piece)])
                finally:
                    await pieces.aclose()
            yield self._last(request, "", reply, usage)


__all__ = ["OpenAIProxyModel", "UpstreamConfig"]
