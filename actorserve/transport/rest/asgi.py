"""The raw-ASGI paths: unary ``infer`` and ``generate``, and every streaming route
(``infer_stream``, ``generate_stream`` POST and GET), each also under
``/versions/{v}/``.

These are the hot paths, where Quart's per-request and per-chunk machinery cost 30-45%
of the throughput. They use the functions of :mod:`.wire`, :mod:`.generate` and
:mod:`.sse`, call only :class:`~actorserve.api.EngineAPI`, and answer exactly as the
Quart views would: same JSON errors and statuses, same 413 and gzip rules.

Cancellation: every request here watches for ``http.disconnect`` while it runs; a
client that goes away cancels the request's scope at once, which leaves the engine's
stream context (or ``infer`` call), which cancels the request in the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl

import trio

from ...api import EngineAPI, ResponseIterator
from ...errors import ModelNotFound
from ...limits import CODE_IN_THREAD_ELEMENTS, PARSE_IN_THREAD_BYTES
from ...rawevents import RawEvent
from ...types import InferenceRequest, InferenceResponse
from ..errors import BodyTimeout, BodyTooLarge, http_status
from ..exchange import Exchange, Recorder
from ..httphost.replies import ASGIReceive, ASGIScope, ASGISend, send_whole
from ..receive import Disconnected, cancel_on_disconnect, read_body
from .generate import (
    Encoder,
    encode_event_source,
    encode_generate,
    generate_request_from_json,
    generate_request_from_query,
    parse_generate_body,
)
from .sequence_headers import OIP, SequenceNaming, answer_headers, sequence_flags
from .sse import EVENT_STREAM_HEADERS, Batches, write_events
from .templates import for_stream
from .wire import (
    GZIP_HEADERS,
    GZIP_IN_THREAD_BYTES,
    HttpReply,
    RequestHeaders,
    apply_sequence_headers,
    decode_infer_request,
    decompress_body,
    encode_infer_response,
    encode_oip,
    error_reply,
    gzip,
    json_reply,
    should_gzip,
    too_large_reply,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Raw ASGI messages are handled as plain dicts; hypercorn's TypedDicts only matter at
# the boundary (app.py), where these aliases are cast.

#: The ASGI headers of every event stream, built once.
_EVENT_STREAM_HEADERS: Final = tuple((k.lower().encode(), v.encode()) for k, v in EVENT_STREAM_HEADERS)


# -- the one gzip rule ---------------------------------------------------------------------


async def gzip_if_wanted(
    body: bytes, already_encoded: bool, accept_encoding: str | None, min_bytes: int
) -> bytes | None:
    """``body`` gzipped when :func:`~.wire.should_gzip` says so (large bodies in a worker
    thread, off the event loop), else None. Used for every complete reply, raw or Quart."""
    if not should_gzip(len(body), already_encoded, accept_encoding, min_bytes):
        return None
    if len(body) >= GZIP_IN_THREAD_BYTES:
        return await trio.to_thread.run_sync(gzip, body)
    return gzip(body)


# -- unary infer (shared with the Quart view) ---------------------------------------------


def reply_for(error: BaseException, limit: int) -> HttpReply:
    """The error reply for anything raised while serving a request."""
    if isinstance(error, BodyTimeout):
        return json_reply({"error": str(error)}, 408)
    return too_large_reply(limit) if isinstance(error, BodyTooLarge) else error_reply(error)


def note_error(exchange: Exchange | None, error: BaseException) -> None:
    """Tell the exchange (metrics) that the request named a model that does not exist."""
    if exchange is not None and isinstance(error, ModelNotFound):
        exchange.not_found = True


def note_response(exchange: Exchange | None, response: InferenceResponse) -> None:
    if exchange is not None:
        exchange.answered(response.model_version, response.parameters.get("sequence_id"))


async def decode_off_loop(
    parse: Callable[[bytes, RequestHeaders], _T], body: bytes, headers: RequestHeaders, limit: int
) -> _T:
    """Inflate ``body`` (``limit``: ``max_body_bytes``) and ``parse`` it: in a worker
    thread when it is compressed or at least ``PARSE_IN_THREAD_BYTES``, so that inflating
    and parsing megabytes never stalls the other requests on this event loop."""

    def run() -> _T:
        return parse(decompress_body(body, headers.content_encoding, limit), headers)

    if headers.content_encoding is None and len(body) < PARSE_IN_THREAD_BYTES:
        return run()
    return await trio.to_thread.run_sync(run)


async def infer_reply(
    engine: EngineAPI,
    name: str,
    version: str | None,
    body: bytes,
    headers: RequestHeaders,
    limit: int,
    exchange: Exchange | None = None,
) -> HttpReply:
    """Decode, infer, encode; every failure is an error reply, never an exception."""
    try:
        request, encoding = await decode_off_loop(decode_infer_request, body, headers, limit)
        flags = sequence_flags(request)
        # the call holds the request from here: on a front it is dropped once sent, so the
        # front never holds a request's tensors and their answer at once (cost bound)
        pending = engine.infer(request, model=name, version=version)
        del request
        response = await pending
        note_response(exchange, response)
        head = await answer_headers(engine, response, headers.naming, flags)
        if sum(t.size for t in response.outputs) < CODE_IN_THREAD_ELEMENTS:
            return encode_infer_response(response, encoding, head)
        # a Python step per BYTES element: off the loop, so it never stalls the others
        return await trio.to_thread.run_sync(encode_infer_response, response, encoding, head)
    except Exception as exc:
        note_error(exchange, exc)
        return reply_for(exc, limit)


# -- the raw routes ------------------------------------------------------------------------


class RawRoutes:
    """The handlers of the raw paths over one engine. ``limit`` is ``max_body_bytes``;
    ``gzip_min`` is ``gzip_min_bytes``."""

    def __init__(
        self, engine: EngineAPI, limit: int, gzip_min: int, recorder: Recorder, naming: SequenceNaming = OIP
    ) -> None:
        self.engine = engine
        self.recorder = recorder
        self._limit = limit
        self._gzip_min = gzip_min
        #: the sequence id's headers (``--sequence-headers``)
        self.naming = naming

    async def serve(
        self,
        op: str,
        scope: ASGIScope,
        receive: ASGIReceive,
        send: ASGISend,
        name: str,
        version: str | None,
        exchange: Exchange,
    ) -> None:
        """Serve ``op`` (``infer``, ``generate``, ``infer_stream``, ``generate_stream``)
        for a method the route allows (the caller checked); what happens goes into
        ``exchange`` (metrics, access log)."""
        headers = RequestHeaders.from_asgi(scope["headers"], self.naming)
        try:
            body = await read_body(receive, self._limit, headers.content_length)
        except Disconnected:
            exchange.disconnected = True
            return
        except Exception as exc:
            await self._send_reply(send, reply_for(exc, self._limit), headers)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope, exchange.note_disconnect)
            if op == "infer":
                reply = await infer_reply(self.engine, name, version, body, headers, self._limit, exchange)
                await self._send_reply(send, reply, headers)
            elif op == "generate":
                await self._generate(send, name, version, body, headers, exchange)
            else:
                await self._stream(scope, send, op, name, version, body, headers, exchange)
            nursery.cancel_scope.cancel()

    async def _generate(
        self,
        send: ASGISend,
        name: str,
        version: str | None,
        body: bytes,
        headers: RequestHeaders,
        exchange: Exchange,
    ) -> None:
        try:
            request, encode = await self._generate_request(name, version, body, headers)
            flags = sequence_flags(request)
            response = await self.engine.infer(request, model=name, version=version)
            note_response(exchange, response)
            head = await answer_headers(self.engine, response, headers.naming, flags)
            reply = HttpReply(200, [("Content-Type", "application/json"), *head], encode(response))
        except Exception as exc:
            note_error(exchange, exc)
            reply = reply_for(exc, self._limit)
        await self._send_reply(send, reply, headers)

    async def _generate_request(
        self, name: str, version: str | None, body: bytes, headers: RequestHeaders
    ) -> tuple[InferenceRequest, Encoder]:
        """Either shape of a generate body: OIP tensors (answered as OIP, like infer) or
        Triton's ``text_input`` shape (answered with ``text_output``)."""
        parsed = await decode_off_loop(parse_generate_body, body, headers, self._limit)
        if isinstance(parsed, tuple):
            return parsed
        datatypes = (await self.engine.metadata(name, version)).input_datatypes()
        request = generate_request_from_json(parsed, datatypes)
        apply_sequence_headers(request, headers)
        return request, encode_generate

    async def _stream(
        self,
        scope: ASGIScope,
        send: ASGISend,
        op: str,
        name: str,
        version: str | None,
        body: bytes,
        headers: RequestHeaders,
        exchange: Exchange,
    ) -> None:
        """An SSE response. The first batch of responses is pulled before the response
        starts, so an error known by then gets its status; later errors become
        ``event: error``. Each later batch (every response already waiting) is one write."""
        end_event = False
        try:
            if scope["method"] == "GET":  # generate_stream for EventSource
                datatypes = (await self.engine.metadata(name, version)).input_datatypes()
                request = generate_request_from_query(_query(scope), datatypes)
                apply_sequence_headers(request, headers)
                encode: Encoder = encode_event_source
                end_event = True
            elif op == "infer_stream":
                request = (await decode_off_loop(decode_infer_request, body, headers, self._limit))[0]
                encode = encode_oip
            else:
                request, encode = await self._generate_request(name, version, body, headers)
        except Exception as exc:
            note_error(exchange, exc)
            await self._send_reply(send, reply_for(exc, self._limit), headers)
            return
        encode = for_stream(encode)  # the stream's constants rendered once, each event spliced

        async def send_chunk(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        def sent(count: int) -> None:
            self.recorder.responses(exchange, count)

        def failed(error: BaseException) -> None:
            exchange.stream_error = http_status(error)

        started = False
        flags = sequence_flags(request)
        try:
            async with self.engine.infer_stream(request, model=name, version=version) as responses:
                try:
                    first = await responses.next_batch()
                except StopAsyncIteration:
                    first = []
                start_headers = list(_EVENT_STREAM_HEADERS)
                if first:
                    head = await answer_headers(self.engine, first[0], headers.naming, flags)
                    start_headers += _asgi_headers(head)
                    note_response(exchange, first[0])
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": start_headers})
                rest, encode_any = _raw_if_possible(responses, encode)
                tail = await write_events(
                    first, rest, encode_any, send_chunk, end_event=end_event, on_sent=sent, on_error=failed
                )
        except Exception as exc:
            if started:  # a bug after the stream started: nothing left to tell the client
                log.error("an event stream failed after it started", exc_info=exc)
                exchange.stream_error = 500
                tail = b""
            else:
                note_error(exchange, exc)
                await self._send_reply(send, reply_for(exc, self._limit), headers)
                return
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _send_reply(self, send: ASGISend, reply: HttpReply, headers: RequestHeaders) -> None:
        await send_reply(send, reply, headers.accept_encoding, self._gzip_min)


class _RawBatches:
    """A remote stream's batches with the responses left raw (``next_raw_batch``)."""

    __slots__ = ("_next",)

    def __init__(
        self, next_raw_batch: Callable[[], Awaitable[Sequence[RawEvent | InferenceResponse]]]
    ) -> None:
        self._next = next_raw_batch

    async def next_batch(self) -> Sequence[RawEvent | InferenceResponse]:
        return await self._next()


def _raw_if_possible(
    responses: ResponseIterator, encode: Encoder
) -> tuple[Batches[Any], Callable[[Any], bytes]]:
    """What to read the rest of a stream from, and how to encode each item: the raw events
    of a front's engine client when the stream's template can write them (no response
    built per event), else the responses."""
    raw = getattr(encode, "raw", None)
    if raw is None:
        return responses, encode

    def encode_any(item: RawEvent | InferenceResponse) -> bytes:
        return raw(item) if isinstance(item, RawEvent) else encode(item)

    return _RawBatches(responses.next_raw_batch), encode_any


async def send_reply(
    send: ASGISend, reply: HttpReply, accept_encoding: str | None = None, gzip_min: int = 0
) -> None:
    """Send a complete reply (gzipped when the client accepts it and it is large)."""
    raw_headers = _asgi_headers(reply.headers)
    body = reply.body
    if accept_encoding is not None:
        packed = await gzip_if_wanted(body, False, accept_encoding, gzip_min)
        if packed is not None:
            body = packed
            raw_headers += _asgi_headers(GZIP_HEADERS)
    await send_whole(send, reply.status, raw_headers, body)


def _asgi_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def _query(scope: ASGIScope) -> list[tuple[str, list[str]]]:
    """The query string as (key, every value) in order of first appearance."""
    grouped: dict[str, list[str]] = {}
    for key, value in parse_qsl(scope["query_string"].decode("utf-8", "replace"), keep_blank_values=True):
        grouped.setdefault(key, []).append(value)
    return list(grouped.items())
