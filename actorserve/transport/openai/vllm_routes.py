"""vLLM's OpenAI server's own routes beside ``/v1``, which its clients and benchmarks
use: ``/health`` (open) and the model's tokenizer, ``/tokenize`` and ``/detokenize``
(inference: they run a model). Routed by :class:`~.routes.OpenAIRoutes`; bodies checked
by :mod:`.tokenize` (no I/O)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

from ...api import EngineAPI
from ...textgen import TextGeneration, response_text
from ...texttokens import detokenize_request, tokenize_request
from ..exchange import Exchange
from ..httphost.replies import ASGISend, send_whole
from .chat import render_chat
from .parse import OpenAIError
from .replies import loads_body, note_missing, send_error, send_json
from .tokenize import parse_detokenize, parse_tokenize, tokenize_payload


class VllmRoutes:
    """The routes, over ``engine``; ``text_model`` reads a model's text-generation
    declaration (the door's, with its errors)."""

    def __init__(self, engine: EngineAPI, text_model: Callable[[str], Awaitable[TextGeneration]]) -> None:
        self.engine = engine
        self._text_model = text_model

    async def health(self, send: ASGISend) -> None:
        """vLLM's ``/health``: 200 with no body while the engine answers."""
        try:
            await self.engine.models()
        except Exception as exc:
            await send_error(send, exc)
            return
        await send_whole(send, 200, [], b"")

    async def tokenizer(
        self, send: ASGISend, body: bytes, exchange: Exchange | None, *, detokenize: bool
    ) -> None:
        """vLLM's ``/tokenize`` and ``/detokenize``, answered by the model's own tokenizer
        (a model whose text-generation declaration has ``tokenize``)."""
        try:
            obj = await loads_body(body)
            if detokenize:
                name, ids = parse_detokenize(obj)
                name, spec = await self._tokenizing_model(name)
                request = detokenize_request(ids)
            else:
                call = parse_tokenize(obj)
                name, spec = await self._tokenizing_model(call.model)
                if call.messages is not None:
                    text = render_chat(name, spec.chat_template, call.messages, call.add_generation_prompt)
                else:
                    text = call.prompt or ""
                request = tokenize_request(
                    spec.input, text, add_special_tokens=call.add_special_tokens, strings=call.token_strs
                )
            if exchange is not None:
                exchange.model_request(name, None)
            response = await self.engine.infer(request, model=name)
            if detokenize:
                payload = {"prompt": response_text(response, spec.output)}
            else:
                payload = tokenize_payload(response)
        except Exception as exc:
            note_missing(exchange, exc)
            await send_error(send, exc)
            return
        await send_json(send, 200, orjson.dumps(payload))

    async def _tokenizing_model(self, name: str | None) -> tuple[str, TextGeneration]:
        """The model a tokenizer request names (None: the only ready model that tokenizes)."""
        if name is None:
            names = sorted(
                {
                    m.name
                    for m in await self.engine.models()
                    if m.ready and m.text_generation and m.text_generation.tokenize
                }
            )
            if len(names) != 1:
                raise OpenAIError(
                    f"'model' is required: {len(names)} models tokenize here ({', '.join(names) or 'none'})",
                    param="model",
                    code="missing_required_parameter",
                )
            name = names[0]
        spec = await self._text_model(name)
        if not spec.tokenize:
            raise OpenAIError(
                f"model {name!r} does not tokenize (text_generation.tokenize)",
                param="model",
                code="model_not_supported",
            )
        return name, spec


__all__ = ["VllmRoutes"]
