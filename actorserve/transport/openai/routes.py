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
from typing import Any, Final

import orjson
import trio

from ...api import EngineAPI
from ...errors import BadInput, ModelNotFound, ShuttingDown
from ...limits import PARSE_IN_THREAD_BYTES, check_json_containers
from ...textgen import TextGeneration
from ..auth import Scope
from ..errors import RETRY_AFTER_SECONDS, BodyTimeout, BodyTooLarge
from ..exchange import Exchange
from ..httphost.openapi import OpenApiPart
from ..httphost.replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend
from ..receive import Disconnected, cancel_on_disconnect, read_body, too_large
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

log = logging.getLogger(__name__)


_JSON: Final = [(b"content-type", b"application/json")]
_EVENT_STREAM: Final = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
#: events buffered per choice between the engine and the writer
_EVENTS_PER_CHOICE: Final = 16
#: the routes that run a model (``/v1/models`` is metadata: open)
_INFERENCE: Final = frozenset({"/v1/completions", "/v1/chat/completions"})


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

    @staticmethod
    def claims(path: str) -> bool:
        return path.startswith("/v1/")

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
        return Scope.INFERENCE if _route(path) in _INFERENCE else None

    async def __call__(
        self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange | None = None
    ) -> None:
        path = _route(scope["path"])
        method: str = scope["method"]
        if path == "/v1/models" or path.startswith("/v1/models/"):
            allowed = "GET"
        elif path in _INFERENCE:
            allowed = "POST"
        else:
            await _send_error(
                send, OpenAIError(f"no such endpoint: {method} {path}", status=404, code="unknown_url")
            )
            return
        if method != allowed:
            error = OpenAIError(
                f"method {method} is not allowed on {path}", status=405, code="method_not_allowed"
            )
            await _send_error(send, error, [(b"allow", allowed.encode())])
            return
        if allowed == "GET":
            if too_large(scope, self._limit):  # a body nobody reads is still refused unread
                await _send_error(send, _too_large(self._limit))
                return
            await self._models(send, path.removeprefix("/v1/models").removeprefix("/"))
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = await _read_body(receive, headers, self._limit)
        except Disconnected:
            return
        except OpenAIError as exc:
            await _send_error(send, exc)
            return
        disconnected = exchange.note_disconnect if exchange is not None else None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope, disconnected)
            await self._generate(send, body, headers, exchange, chat=path.endswith("/chat/completions"))
            nursery.cancel_scope.cancel()

    async def _models(self, send: ASGISend, name: str) -> None:
        try:
            models = [m for m in await self.engine.models() if m.ready and m.text_generation is not None]
            created = int(time.time())
            if not name:
                unique = {m.name: m for m in models}
                await _send_json(send, 200, model_list(list(unique.values()), created))
            elif any(m.name == name for m in models):
                await _send_json(send, 200, orjson.dumps(model_object(name, created)))
            else:
                await _send_error(send, _no_model(name))
        except Exception as exc:
            await _send_error(send, exc)

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
            obj = await _loads(body)
            call = parse_chat(obj, headers) if chat else parse_completion(obj, headers)
            if exchange is not None:  # the model it names: the metrics' labels
                exchange.model_request(call.model, None)
            spec = await self._text_model(call.model)
            if chat:
                prompts = [render_chat(call.model, spec.chat_template, call.messages)]
            else:
                prompts = list(call.prompts)
            runs = plan_choices(spec, prompts, call.options, call.n, spec.chat_stop if chat else ())
        except Exception as exc:
            _note_missing(exchange, exc)
            await _send_error(send, exc)
            return
        call_id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        if call.stream:
            shape = ChunkShape(call_id, call.model, int(time.time()), chat, call.include_usage)
            await self._stream(send, call, spec, runs, shape)
            return
        try:
            await run_all(self.engine, spec, call.model, runs)
        except Exception as exc:
            _note_missing(exchange, exc)
            await _send_error(send, exc)
            return
        sequence_id = runs[0].sequence_id
        encode = chat_completion if chat else completion
        payload = encode(
            call_id, call.model, int(time.time()), [r.choice() for r in runs], total_usage(runs), sequence_id
        )
        await _send_json(send, 200, payload, _sequence_header(sequence_id))

    async def _stream(
        self, send: ASGISend, call: TextCall, spec: TextGeneration, runs: list[ChoiceRun], shape: ChunkShape
    ) -> None:
        """The choices' events as SSE chunks, each write carrying every event already
        waiting. The response starts with the first event, so an error that comes first
        gets its status; a later one is an error chunk that ends the stream."""
        send_events, receive_events = trio.open_memory_channel[Event](_EVENTS_PER_CHOICE * len(runs))
        opened: set[int] = set()
        started = False

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
                        await _send_error(send, failed)  # before cancelling: that would cancel the send
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
                    if event.text:
                        parts.append(shape.text(index, event.text))
                    if event.end:
                        parts.append(shape.finish(index, event.run.finish_reason))
                await body(b"".join(parts))
                if failed is not None:
                    nursery.cancel_scope.cancel()
                    break
            if failed is None and call.include_usage:
                await body(shape.usage(total_usage(runs)))
        await body(DONE, more=False)


def _note_missing(exchange: Exchange | None, error: BaseException) -> None:
    """Tell the exchange (metrics) that the request named a model that does not exist
    (its name came from the client: it is not a label)."""
    missing = isinstance(error, ModelNotFound) or (
        isinstance(error, OpenAIError) and error.code == "model_not_found"
    )
    if exchange is not None and missing:
        exchange.not_found = True


def _with_sequence(shape: ChunkShape, sequence_id: str) -> ChunkShape:
    return ChunkShape(shape.call_id, shape.model, shape.created, shape.chat, shape.include_usage, sequence_id)


def _sequence_header(sequence_id: str | None) -> list[tuple[str, str]]:
    return [] if sequence_id is None else [("sequence-id", sequence_id)]


def _no_model(name: str, why: str = "") -> OpenAIError:
    return OpenAIError(
        f"The model {name!r} does not exist{why}", status=404, param="model", code="model_not_found"
    )


async def _send_json(
    send: ASGISend, status: int, body: bytes, headers: list[tuple[str, str]] | None = None
) -> None:
    raw = [
        *_JSON,
        *((k.encode(), v.encode()) for k, v in headers or ()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(
    send: ASGISend, error: BaseException, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    status, body = error_status_and_body(error)
    if status >= 500 and not isinstance(error, OpenAIError):
        log.error("an OpenAI request failed", exc_info=error)
    headers = [*_JSON, *(extra or ())]
    if status in (429, 503):
        retry_after = getattr(error, "retry_after", None) or RETRY_AFTER_SECONDS
        headers.append((b"retry-after", str(retry_after).encode()))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _loads(body: bytes) -> Any:
    """The JSON body, its container count checked first; a large one parsed off the loop."""
    try:
        check_json_containers(body)
    except BadInput as exc:
        raise OpenAIError(exc.message) from None
    try:
        if len(body) < PARSE_IN_THREAD_BYTES:
            return orjson.loads(body)
        return await trio.to_thread.run_sync(orjson.loads, body)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(f"the request body is not valid JSON: {exc}") from None


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(f"the request body is larger than {limit} bytes (max_body_bytes)", status=413)


async def _read_body(receive: ASGIReceive, headers: Mapping[str, str], limit: int) -> bytes:
    """The whole request body; 413 as soon as it is known to be over ``limit``."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise OpenAIError(f"Content-Encoding {encoding!r} is not supported here", status=415)
    try:
        return await read_body(receive, limit, headers.get("content-length"))
    except BodyTooLarge:
        raise _too_large(limit) from None
    except BodyTimeout as exc:
        raise OpenAIError(str(exc), status=408) from None
    except BadInput as exc:
        raise OpenAIError(exc.message) from None
