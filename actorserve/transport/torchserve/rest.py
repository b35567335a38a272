"""TorchServe's inference REST API as raw ASGI: ``GET /ping``,
``POST|PUT /predictions/{model}[/{version}]``, ``POST /explanations/...`` (501).

A prediction's body is passed to the handler as input ``body`` with the request's
mime type (a form: one input per field, see :mod:`.forms`), its headers as the request
headers. The answer is the handler's body with
its content type and response headers; a request that streams (intermediate responses,
``ts_stream_next``) is answered as chunked HTTP, one chunk per response, as TorchServe
does. Errors are TorchServe's JSON: ``{"code", "type", "message"}``. A client that goes
away cancels its request (its sequence stays open).
"""

from __future__ import annotations

import json
import re
from typing import Final

import trio

from ...api import EngineAPI
from ...errors import BadInput
from ...limits import PARSE_IN_THREAD_BYTES
from ...torchserve_envelope import STREAM_NEXT, Answer, HeaderNames, ok_status
from ..auth import Scope
from ..errors import BodyTimeout, BodyTooLarge
from ..exchange import Exchange
from ..httphost.replies import ASGIReceive, ASGIScope, ASGISend, send_whole
from ..receive import Disconnected, cancel_on_disconnect, read_body
from .errors import TsError, answer_error, names_no_model, ts_error
from .forms import split_body
from .predictions import Call, Predictor, first_answers

_PREDICTIONS: Final = re.compile(r"/predictions/([^/]+)(?:/([^/]+))?/?")
_EXPLANATIONS: Final = re.compile(r"/explanations/([^/]+)(?:/([^/]+))?/?")


async def send_json(
    send: ASGISend, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_whole(send, status, [(b"content-type", b"application/json"), *(headers or [])], body)


async def send_error(send: ASGISend, error: TsError) -> None:
    await send_json(send, error.code, error.json())


def _content_type(answer: Answer) -> bytes:
    if answer.content_type:
        return answer.content_type.encode("latin-1")
    stripped = answer.body.lstrip()[:1]
    return b"application/json" if stripped in (b"{", b"[") else b"text/plain"


def _headers(answer: Answer, names: HeaderNames, sequence_id: str | None) -> list[tuple[bytes, bytes]]:
    raw = [(b"content-type", _content_type(answer))]
    headers = dict(answer.headers)
    if sequence_id is not None:
        headers.setdefault(names.sequence_id, sequence_id)
    for key, value in headers.items():
        if key.lower() not in ("content-type", "content-length", "transfer-encoding", STREAM_NEXT):
            raw.append((key.lower().encode("latin-1"), str(value).encode("latin-1", "replace")))
    return raw


def _header(scope: ASGIScope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class TorchServeInference:
    """The inference routes; :meth:`serve` answers a request to one of them (and
    returns True) or leaves it to the next router (False)."""

    def __init__(self, engine: EngineAPI, max_body_bytes: int) -> None:
        self.engine = engine
        self.predictor = Predictor(engine)
        self.limit = max_body_bytes

    @staticmethod
    def auth_scope(path: str) -> Scope | None:
        """The scope of ``path`` as :meth:`serve` routes it: predictions and explanations
        are inference; ``/ping`` (health) and paths it does not serve are open here."""
        if _PREDICTIONS.fullmatch(path) or _EXPLANATIONS.fullmatch(path):
            return Scope.INFERENCE
        return None

    async def serve(
        self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange | None = None
    ) -> bool:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/ping":
            if method != "GET":
                await send_error(
                    send, TsError(405, "MethodNotAllowedException", f"{method} /ping is not allowed")
                )
                return True
            healthy = await self.engine.ready()
            status = "Healthy" if healthy else "Unhealthy"
            await send_json(send, 200 if healthy else 500, json.dumps({"status": status}, indent=2).encode())
            return True
        if _EXPLANATIONS.fullmatch(path):
            await send_error(
                send,
                TsError(
                    501,
                    "ServiceUnavailableException",
                    "explanations are not supported by actorserve (TorchServe's Captum explanations); "
                    "call /predictions, or have the handler explain inside its answer",
                ),
            )
            return True
        match = _PREDICTIONS.fullmatch(path)
        if match is None:
            return False
        if method not in ("POST", "PUT"):
            await send_error(
                send, TsError(405, "MethodNotAllowedException", f"{method} {path}: use POST or PUT")
            )
            return True
        if exchange is not None:  # the model it names: the metrics' labels
            exchange.model_request(match[1], match[2])
        await self._predict(scope, receive, send, match[1], match[2], exchange)
        return True

    async def _predict(
        self,
        scope: ASGIScope,
        receive: ASGIReceive,
        send: ASGISend,
        model: str,
        version: str | None,
        exchange: Exchange | None,
    ) -> None:
        try:
            body = await read_body(receive, self.limit, _header(scope, b"content-length"))
        except BodyTooLarge:
            await send_error(
                send,
                TsError(
                    413,
                    "RequestTooLargeException",
                    f"request body is over {self.limit} bytes (max_body_bytes)",
                ),
            )
            return
        except BodyTimeout as exc:
            await send_error(send, TsError(408, "RequestTimeoutException", str(exc)))
            return
        except BadInput as exc:
            await send_error(send, ts_error(exc))
            return
        except Disconnected:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            content_type = headers.get("content-type", "")
            if len(body) < PARSE_IN_THREAD_BYTES:
                inputs = split_body(body, content_type, self.limit)
            else:  # a large form is split off the event loop
                inputs = await trio.to_thread.run_sync(split_body, body, content_type, self.limit)
        except BadInput as exc:
            await send_error(send, ts_error(exc))
            return
        call = Call(model, version, inputs, headers)
        with trio.CancelScope() as scope_:
            async with trio.open_nursery() as nursery:
                disconnected = exchange.note_disconnect if exchange is not None else None
                nursery.start_soon(cancel_on_disconnect, receive, scope_, disconnected)
                await self._answer(send, call, exchange)
                nursery.cancel_scope.cancel()

    async def _answer(self, send: ASGISend, call: Call, exchange: Exchange | None) -> None:
        names = self.predictor.names
        started = False
        try:
            async with self.predictor.stream(call) as (responses, sequence_id):
                answers = await first_answers(responses)
                if not answers:
                    await send_error(
                        send, TsError(503, "InternalServerException", "the model gave no answer")
                    )
                    return
                first = answers[0]
                if not ok_status(first.status):
                    error = answer_error(first)
                    await send_json(send, error.code, error.json(), _headers(first, names, sequence_id)[1:])
                    return
                started = True
                await send(
                    {
                        "type": "http.response.start",
                        "status": first.status,
                        "headers": _headers(first, names, sequence_id),
                    }
                )
                while answers:
                    for answer in answers:
                        await send({"type": "http.response.body", "body": answer.body, "more_body": True})
                    answers = await first_answers(responses)
        except Exception as exc:
            if started:  # nothing left to tell the client but the end of the body
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            error = ts_error(exc)
            if exchange is not None and names_no_model(error):
                exchange.not_found = True
            await send_error(send, error)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
