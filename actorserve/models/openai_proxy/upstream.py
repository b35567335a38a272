"""The upstream side of the OpenAI proxy: its settings, request bodies, reading its
answers (whole or as SSE), and its failures as our own domain errors.

Errors (the message names the upstream URL, never the API key):

- 400 -> :class:`BadInput` (the upstream's message: our client sent something it refuses);
- 429 -> :class:`Overloaded` carrying the upstream's ``Retry-After``;
- 401 / 403 (the key), 404 (the upstream model or path), other statuses, 5xx, timeouts,
  a stream cut before ``[DONE]``, an error event inside the stream -> :class:`ModelFailed`;
- the upstream unreachable (connection refused, DNS) -> :class:`ModelNotReady` (503).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

import attrs
import httpx
import orjson

from ...errors import ActorServeError, BadInput, ModelFailed, ModelNotReady, Overloaded
from ...settings import SettingsError

log = logging.getLogger(__name__)

API_TYPES: Final = ("chat", "completions")
_EXTRA_KEYS: Final = frozenset(
    {"base_url", "model", "api_type", "api_key_env", "timeout", "headers", "max_response_bytes"}
)
_MESSAGE_CHARS: Final = 300
#: the default of ``parameters.extra.max_response_bytes``: the most bytes read of one
#: upstream answer (a whole answer, an error body, or one line of a stream).
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024


@attrs.frozen(slots=True)
class UpstreamConfig:
    """``parameters.extra`` of the proxy's settings. ``api_key``: read from the
    environment variable ``api_key_env`` at load (kept out of ``repr``, never logged)."""

    base_url: str
    model: str
    api_type: str = "chat"
    timeout: float = 60.0
    headers: Mapping[str, str] = attrs.field(factory=dict)
    api_key: str | None = attrs.field(default=None, repr=False)
    max_response_bytes: int = MAX_RESPONSE_BYTES

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + (
            "/chat/completions" if self.api_type == "chat" else "/completions"
        )

    def request_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    @classmethod
    def from_parameters(cls, name: str, parameters: Mapping[str, Any]) -> UpstreamConfig:
        """:class:`SettingsError` says what is missing or wrong."""
        extra = parameters.get("extra")
        where = f"model {name!r}: parameters.extra"
        if not isinstance(extra, Mapping):
            raise SettingsError(f"{where}: expected an object with 'base_url' and 'model'")
        unknown = set(extra) - _EXTRA_KEYS
        if unknown:
            raise SettingsError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_EXTRA_KEYS))}"
            )
        base_url, model = extra.get("base_url"), extra.get("model")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise SettingsError(
                f"{where}.base_url: expected an http(s) URL such as https://api.openai.com/v1"
            )
        if not isinstance(model, str) or not model:
            raise SettingsError(f"{where}.model: expected the upstream model's name")
        api_type = extra.get("api_type", "chat")
        if api_type not in API_TYPES:
            raise SettingsError(f"{where}.api_type: expected one of {list(API_TYPES)}, got {api_type!r}")
        timeout = extra.get("timeout", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise SettingsError(f"{where}.timeout: expected seconds > 0")
        headers = extra.get("headers", {})
        if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
            raise SettingsError(f"{where}.headers: expected an object of strings")
        api_key = None
        env = extra.get("api_key_env")
        if env is not None:
            if not isinstance(env, str) or not env:
                raise SettingsError(f"{where}.api_key_env: expected the name of an environment variable")
            api_key = os.environ.get(env)
            if not api_key:
                raise SettingsError(f"{where}.api_key_env: the environment variable {env} is not set")
        cap = extra.get("max_response_bytes", MAX_RESPONSE_BYTES)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise SettingsError(f"{where}.max_response_bytes: expected a number of bytes >= 1")
        return cls(base_url, model, str(api_type), float(timeout), dict(headers), api_key, cap)


class AnswerTooLarge(ModelFailed):
    """The upstream sent more than ``max_response_bytes`` in one answer or line."""

    def __init__(self, config: UpstreamConfig, what: str) -> None:
        super().__init__(
            f"upstream {config.url} sent {what} larger than {config.max_response_bytes} bytes "
            "(parameters.extra.max_response_bytes); it was not read further"
        )


async def _read_capped(config: UpstreamConfig, response: httpx.Response) -> bytes:
    """The whole body of ``response``, at most ``max_response_bytes`` of it."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > config.max_response_bytes:
            raise AnswerTooLarge(config, "an answer")
    return bytes(body)


async def _lines(config: UpstreamConfig, response: httpx.Response) -> AsyncGenerator[str, None]:
    """The lines of a streamed answer; no line may pass ``max_response_bytes`` (httpx's
    own line reader would buffer a line without end)."""
    pending = bytearray()
    async for chunk in response.aiter_bytes():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            yield pending.rstrip(b"\r").decode("utf-8", "replace")
            pending.clear()
            start = end + 1
        pending += chunk[start:]
        if len(pending) > config.max_response_bytes:
            raise AnswerTooLarge(config, "a stream line")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def request_body(
    config: UpstreamConfig, prompt: str, options: Mapping[str, Any], *, stream: bool, usage: bool
) -> bytes:
    """The upstream request: ``prompt`` as the user message (chat) or the prompt, and the
    options (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``) as given."""
    body: dict[str, Any] = {"model": config.model, **options}
    if config.api_type == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream"] = True
        if usage:
            body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


@attrs.define
class Reply:
    """What the upstream said so far: text pieces are yielded; the rest collects here."""

    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    done: bool = False


def _text_of(config: UpstreamConfig, choice: Mapping[str, Any], *, stream: bool) -> str:
    if config.api_type == "completions":
        text = choice.get("text")
    else:
        text = (choice.get("delta") if stream else choice.get("message") or {}).get("content")  # type: ignore[union-attr]
    return text if isinstance(text, str) else ""


def _read(config: UpstreamConfig, doc: Any, reply: Reply, *, stream: bool) -> str:
    """One upstream JSON object (a whole answer or a chunk): its text; finish and usage
    go to ``reply``."""
    if not isinstance(doc, Mapping):
        raise ModelFailed(f"upstream {config.url} sent something that is not an object: {_short(doc)}")
    if "error" in doc:
        raise ModelFailed(f"upstream {config.url} failed mid-stream: {_message(doc)}")
    usage = doc.get("usage")
    if isinstance(usage, Mapping):
        reply.usage = {k: int(usage.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")}
    choices = doc.get("choices") or []
    if not isinstance(choices, list):
        raise ModelFailed(f"upstream {config.url} sent 'choices' that are not a list")
    text = ""
    for choice in choices[:1]:
        text = _text_of(config, choice, stream=stream)
        if choice.get("finish_reason"):
            reply.finish_reason = str(choice["finish_reason"])
    return text


async def complete(client: httpx.AsyncClient, config: UpstreamConfig, body: bytes, reply: Reply) -> str:
    """A whole (non-streamed) answer's text."""
    try:
        async with client.stream(
            "POST", config.url, content=body, headers=config.request_headers()
        ) as response:
            content = await _read_capped(config, response)
    except httpx.HTTPError as exc:
        raise transport_error(config, exc) from None
    if response.status_code != 200:
        raise status_error(config, response.status_code, response.headers, content)
    try:
        doc = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise ModelFailed(f"upstream {config.url} answered with invalid JSON: {_short(content)}") from None
    text = _read(config, doc, reply, stream=False)
    reply.done = True
    return text


async def stream(
    client: httpx.AsyncClient, config: UpstreamConfig, body: bytes, reply: Reply
) -> AsyncGenerator[str, None]:
    """The text pieces of a streamed answer as they arrive. Leaving the iteration early
    (or being cancelled) closes the upstream response."""
    try:
        async with client.stream(
            "POST", config.url, content=body, headers=config.request_headers()
        ) as response:
            if response.status_code != 200:
                raise status_error(
                    config, response.status_code, response.headers, await _read_capped(config, response)
                )
            async for line in _lines(config, response):
                if not line.startswith("data:"):
                    continue  # comments, event names, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    reply.done = True
                    return
                try:
                    doc = orjson.loads(data)
                except orjson.JSONDecodeError:
                    raise ModelFailed(
                        f"upstream {config.url} sent an event that is not JSON: {_short(data)}"
                    ) from None
                text = _read(config, doc, reply, stream=True)
                if text:
                    yield text
    except httpx.HTTPError as exc:
        raise transport_error(config, exc) from None
    if not reply.done:
        raise ModelFailed(f"upstream {config.url}: the stream was cut before [DONE]")


def transport_error(config: UpstreamConfig, error: httpx.HTTPError) -> ActorServeError:
    """A failure to talk to the upstream at all."""
    if isinstance(error, httpx.TimeoutException):
        return ModelFailed(f"upstream {config.url} timed out (no answer within {config.timeout:g} s)")
    if isinstance(error, httpx.ConnectError):
        return ModelNotReady(f"upstream {config.url} is unreachable: {error}")
    if isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
        return ModelFailed(f"upstream {config.url}: the stream was cut ({type(error).__name__}: {error})")
    return ModelFailed(f"upstream {config.url} failed: {type(error).__name__}: {error}")


def status_error(config: UpstreamConfig, status: int, headers: httpx.Headers, body: bytes) -> ActorServeError:
    """An upstream's error status as our error (see the module docstring)."""
    detail = _message(_json(body))
    where = f"upstream {config.url} answered {status}"
    log.warning("%s: %s", where, detail)
    if status == 400:
        return BadInput(f"{where}: {detail}")
    if status == 429:
        return Overloaded(
            f"{where} (rate limited): {detail}", retry_after=_retry_after(headers.get("retry-after"))
        )
    if status in (401, 403):
        return ModelFailed(f"{where}: the upstream refused our credentials (check api_key_env): {detail}")
    if status == 404:
        return ModelFailed(f"{where}: no such upstream model or path ({config.model!r}): {detail}")
    return ModelFailed(f"{where}: {detail}")


def _retry_after(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: our default applies
    return max(1, math.ceil(seconds)) if math.isfinite(seconds) else None


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")


def _message(doc: Any) -> str:
    """The upstream's own error message (OpenAI's shape, or whatever it sent), shortened."""
    if isinstance(doc, Mapping):
        error = doc.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return _short(error["message"])
        if isinstance(error, str):
            return _short(error)
    return _short(doc)


def _short(value: Any) -> str:
    text = (
        value
        if isinstance(value, str)
        else value.decode("utf-8", "replace")
        if isinstance(value, bytes)
        else repr(value)
    )
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."
