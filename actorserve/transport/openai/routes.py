"""The OpenAI routes as a raw-ASGI application: ``GET /v1/models[/{model}]``,
``POST /v1/completions`` and ``POST /v1/chat/completions`` (unary, or SSE with
``"stream": true``), over any :class:`~actorserve.api.EngineAPI`.

A model is served here when it declares text generation (``ModelInfo.text_generation``).
Every error is OpenAI's shape with a meaningful status. A client that disconnects
cancels its request at once (every choice leaves its engine stream, so the engine
drops it from the batch at the next step).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from typing import Final

import orjson
import trio

from ...api import EngineAPI
from ...errors import ModelNotFound, ShuttingDown
from ...textgen import TextGeneration, UnsupportedOption
from ...version import __version__
from ..auth import Scope
from ..exchange import Exchange
from ..httphost.openapi import OpenApiPart
from ..httphost.replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend
from ..receive import Disconnected, cancel_on_disconnect, too_large
from .chat import render_chat
from .choices import ChoiceRun, Event, drain, plan_choices, run_all, stream_choice, total_usage
from .encode import (
    DONE,
    ChunkShape,
    chat_completion,
    completion,
    error_status_and_body,
    model_list,
    model_object,
    stream_error,
)
from .openapi import openapi_part
from .parse import OpenAIError, TextCall, parse_chat, parse_completion
from .replies import (
    loads_body,
    note_missing,
    read_request_body,
    send_error,
    send_json,
    too_large_error,
)
from .vllm_routes import VllmRoutes

log = logging.getLogger(__name__)


_EVENT_STREAM: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
#: events buffered per choice between the engine and the writer
_EVENTS_PER_CHOICE: Final = 16
#: the routes that run a model (``/v1/models`` is metadata: open)
_INFERENCE: Final = frozenset({"/v1/completions", "/v1/chat/completions"})
#: vLLM's OpenAI server's own routes beside ``/v1`` (its clients and benchmarks use them):
#: the tokenizer's (they run a model: inference) and the probes (open)
_TOKENIZER: Final = frozenset({"/tokenize", "/detokenize"})
_PROBES: Final = frozenset({"/health", "/version"})


def _route(path: str) -> str:
    """The route a path under ``/v1/`` is served as: a trailing ``/`` is ignored (as
    OpenAI's clients sometimes send it)."""
    return path.rstrip("/")


class OpenAIRoutes:
    """The OpenAI door: serves every path under ``/v1/``. ``limit`` is ``max_body_bytes``."""

    #: no framework to start
    lifespan: ASGIApp | None = None

    def __init__(self, engine: EngineAPI, limit: int) -> None:
        self.engine = engine
        self._limit = limit
        self.vllm = VllmRoutes(engine, self._text_model)  # /health, /tokenize, /detokenize

    @staticmethod
    def claims(path: str) -> bool:
        return path.startswith("/v1/") or path in _TOKENIZER or path in _PROBES

    @staticmethod
    def openapi() -> OpenApiPart:
        """The ``/v1`` paths (:mod:`.openapi`)."""
        return openapi_part()

    @staticmethod
    def bad_target(why: str) -> tuple[int, bytes]:
        """400 in OpenAI's error shape, for a request the host refuses before routing."""
        return error_status_and_body(OpenAIError(why, status=400, code="invalid_request"))

    @staticmethod
    def forbidden(why: str) -> tuple[int, bytes]:
        """403 in OpenAI's error shape, for a request the host refuses unread."""
        return error_status_and_body(OpenAIError(why, status=403, code="forbidden"))

    @staticmethod
    def shutting_down(message: str) -> tuple[int, bytes]:
        return error_status_and_body(ShuttingDown(message))

    @staticmethod
    def stream_end(method: str, path: str, message: str) -> bytes:
        """The error event and ``data: [DONE]``."""
        return stream_error(ShuttingDown(message)) + DONE

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange) -> None:
        await self(scope, receive, send, exchange)

    @staticmethod
    def auth_scope(path: str) -> Scope | None:
        """The scope of a path under ``/v1/``, read as :meth:`__call__` routes it."""
        route = _route(path)
        return Scope.INFERENCE if route in _INFERENCE or route in _TOKENIZER else None

    async def __call__(
        self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange | None = None
    ) -> None:
        path = _route(scope["path"])
        method: str = scope["method"]
        if path == "/v1/models" or path.startswith("/v1/models/") or path in _PROBES:
            allowed = "GET"
        elif path in _INFERENCE or path in _TOKENIZER:
            allowed = "POST"
        else:
            await send_error(
                send, OpenAIError(f"no such endpoint: {method} {path}", status=404, code="unknown_url")
            )
            return
        if method != allowed:
            error = OpenAIError(
                f"method {method} is not allowed on {path}", status=405, code="method_not_allowed"
            )
            await send_error(send, error, [(b"allow", allowed.encode())])
            return
        if allowed == "GET":
            if too_large(scope, self._limit):  # a body nobody reads is still refused unread
                await send_error(send, too_large_error(self._limit))
                return
            if path == "/health":
                await self.vllm.health(send)
            elif path == "/version":
                await send_json(send, 200, orjson.dumps({"version": __version__}))
            else:
                await self._models(send, path.removeprefix("/v1/models").removeprefix("/"))
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = await read_request_body(receive, headers, self._limit)
        except Disconnected:
            return
        except OpenAIError as exc:
            await send_error(send, exc)
            return
        disconnected = exchange.note_disconnect if exchange is not None else None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope, disconnected)
            if path in _TOKENIZER:
                await self.vllm.tokenizer(send, body, exchange, detokenize=path == "/detokenize")
            else:
                await self._generate(send, body, headers, exchange, chat=path.endswith("/chat/completions"))
            nursery.cancel_scope.cancel()

    async def _models(self, send: ASGISend, name: str) -> None:
        try:
            models = [m for m in await self.engine.models() if m.ready and m.text_generation is not None]
            created = int(time.time())
            if not name:
                unique = {m.name: m for m in models}
                await send_json(send, 200, model_list(list(unique.values()), created))
            elif any(m.name == name for m in models):
                await send_json(send, 200, orjson.dumps(model_object(name, created)))
            else:
                await send_error(send, _no_model(name))
        except Exception as exc:
            await send_error(send, exc)

    async def _text_model(self, name: str) -> TextGeneration:
        try:
            info = await self.engine.model_info(name)
        except ModelNotFound:
            raise _no_model(name) from None
        if info.text_generation is None:
            raise _no_model(name, " (it does not generate text)")
        return info.text_generation

    async def _generate(
        self,
        send: ASGISend,
        body: bytes,
        headers: Mapping[str, str],
        exchange: Exchange | None,
        *,
        chat: bool,
    ) -> None:
        try:
            obj = await loads_body(body)
            call = parse_chat(obj, headers) if chat else parse_completion(obj, headers)
            if exchange is not None:  # the model it names: the metrics' labels
                exchange.model_request(call.model, None)
            spec = await self._text_model(call.model)
            turn = None
            if chat and call.options.sequence and spec.chat_history:
                # the model renders the sequence's whole conversation (textgen.TextGeneration)
                render_chat(call.model, spec.chat_template, call.messages)  # its errors here, as 400
                prompts, turn = [], call.messages
            elif chat:
                prompts = [render_chat(call.model, spec.chat_template, call.messages)]
            else:
                prompts = list(call.prompts)
            extra_stop = spec.chat_stop if chat else ()
            try:
                runs = plan_choices(spec, prompts, call.options, call.n, extra_stop, turn, call.echo)
            except UnsupportedOption as exc:
                raise OpenAIError(exc.message, param=exc.option, code="unsupported_parameter") from None
        except Exception as exc:
            note_missing(exchange, exc)
            await send_error(send, exc)
            return
        call_id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        if call.stream:
            shape = ChunkShape(call_id, call.model, int(time.time()), chat, call.include_usage)
            await self._stream(send, call, spec, runs, shape)
            return
        try:
            await run_all(self.engine, spec, call.model, runs)
        except Exception as exc:
            note_missing(exchange, exc)
            await send_error(send, exc)
            return
        sequence_id = runs[0].sequence_id
        encode = chat_completion if chat else completion
        payload = encode(
            call_id, call.model, int(time.time()), [r.choice() for r in runs], total_usage(runs), sequence_id
        )
        await send_json(send, 200, payload, _sequence_header(sequence_id))

    async def _stream(
        self, send: ASGISend, call: TextCall, spec: TextGeneration, runs: list[ChoiceRun], shape: ChunkShape
    ) -> None:
        """The choices' events as SSE chunks, each write carrying every event already
        waiting. The response starts with the first event, so an error that comes first
        gets its status; a later one is an error chunk that ends the stream."""
        send_events, receive_events = trio.open_memory_channel[Event](_EVENTS_PER_CHOICE * len(runs))
        opened: set[int] = set()
        started = False
        # logprobs or the usage in every chunk: chunks built as documents (not the template)
        slow = call.continuous_usage or call.options.logprobs is not None
        offsets = [0] * len(runs)  # where each choice's next text starts (logprobs' text_offset)

        async def body(chunk: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

        async with trio.open_nursery() as nursery, receive_events:
            async with send_events:
                for run in runs:
                    nursery.start_soon(stream_choice, self.engine, spec, call.model, run, send_events.clone())
            failed: Exception | None = None
            async for first in receive_events:
                events = drain(first, receive_events)
                if not started:
                    failed = next((e.error for e in events if e.error is not None), None)
                    if failed is not None:
                        await send_error(send, failed)  # before cancelling: that would cancel the send
                        nursery.cancel_scope.cancel()
                        return
                    sequence_id = events[0].run.sequence_id
                    if sequence_id is not None:
                        shape = _with_sequence(shape, sequence_id)
                    start = _EVENT_STREAM + [
                        (k.encode(), v.encode()) for k, v in _sequence_header(sequence_id)
                    ]
                    await send({"type": "http.response.start", "status": 200, "headers": start})
                    started = True
                parts: list[bytes] = []
                for event in events:
                    index = event.run.index
                    if index not in opened:
                        opened.add(index)
                        parts.append(shape.opening(index))
                    if event.error is not None:
                        failed = event.error
                        parts.append(stream_error(event.error))
                        break
                    usage = total_usage(runs) if call.continuous_usage else None
                    if slow and (event.text or event.logprobs):
                        logprobs = event.logprobs if call.options.logprobs is not None else None
                        parts.append(shape.text_slow(index, event.text, logprobs, offsets[index], usage))
                        offsets[index] += len(event.text)
                    elif event.text:
                        parts.append(shape.text(index, event.text))
                    if event.end:
                        parts.append(shape.finish(index, event.run.finish_reason, usage))
                await body(b"".join(parts))
                if failed is not None:
                    nursery.cancel_scope.cancel()
                    break
            if failed is None and call.include_usage:
                await body(shape.usage(total_usage(runs)))
        await body(DONE, more=False)


def _with_sequence(shape: ChunkShape, sequence_id: str) -> ChunkShape:
    return ChunkShape(shape.call_id, shape.model, shape.created, shape.chat, shape.include_usage, sequence_id)


def _sequence_header(sequence_id: str | None) -> list[tuple[str, str]]:
    return [] if sequence_id is None else [("sequence-id", sequence_id)]


def _no_model(name: str, why: str = "") -> OpenAIError:
    return OpenAIError(
        f"The model {name!r} does not exist{why}", status=404, param="model", code="model_not_found"
    )
