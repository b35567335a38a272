"""Writing the OpenAI door's unary replies and reading its request bodies over raw ASGI:
JSON answers, errors in OpenAI's shape (with ``Retry-After`` on 429 / 503), and a body
read within ``max_body_bytes`` and parsed with its containers counted first."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import orjson
import trio

from ...errors import BadInput, ModelNotFound
from ...limits import PARSE_IN_THREAD_BYTES, check_json_containers
from ..errors import RETRY_AFTER_SECONDS, BodyTimeout, BodyTooLarge
from ..exchange import Exchange
from ..httphost.replies import ASGIReceive, ASGISend, send_whole
from ..receive import read_body
from .encode import error_status_and_body
from .parse import OpenAIError

log = logging.getLogger(__name__.rpartition(".")[0] + ".routes")  # the door's logger, as before


_JSON: Final = [(b"content-type", b"application/json")]


def note_missing(exchange: Exchange | None, error: BaseException) -> None:
    """Tell the exchange (metrics) that the request named a model that does not exist
    (its name came from the client: it is not a label)."""
    missing = isinstance(error, ModelNotFound) or (
        isinstance(error, OpenAIError) and error.code == "model_not_found"
    )
    if exchange is not None and missing:
        exchange.not_found = True


async def send_json(
    send: ASGISend, status: int, body: bytes, headers: list[tuple[str, str]] | None = None
) -> None:
    await send_whole(send, status, [*_JSON, *((k.encode(), v.encode()) for k, v in headers or ())], body)


async def send_error(
    send: ASGISend, error: BaseException, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    status, body = error_status_and_body(error)
    if status >= 500 and not isinstance(error, OpenAIError):
        log.error("an OpenAI request failed", exc_info=error)
    headers = [*_JSON, *(extra or ())]
    if status in (429, 503):
        retry_after = getattr(error, "retry_after", None) or RETRY_AFTER_SECONDS
        headers.append((b"retry-after", str(retry_after).encode()))
    await send_whole(send, status, headers, body)


async def loads_body(body: bytes) -> Any:
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


def too_large_error(limit: int) -> OpenAIError:
    return OpenAIError(f"the request body is larger than {limit} bytes (max_body_bytes)", status=413)


async def read_request_body(receive: ASGIReceive, headers: Mapping[str, str], limit: int) -> bytes:
    """The whole request body; 413 as soon as it is known to be over ``limit``."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise OpenAIError(f"Content-Encoding {encoding!r} is not supported here", status=415)
    try:
        return await read_body(receive, limit, headers.get("content-length"))
    except BodyTooLarge:
        raise too_large_error(limit) from None
    except BodyTimeout as exc:
        raise OpenAIError(str(exc), status=408) from None
    except BadInput as exc:
        raise OpenAIError(exc.message) from None
