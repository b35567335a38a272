"""OpenAI response bodies, with no I/O: completions, chat completions, their stream
chunks, the model list, and errors in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``).

Every builder returns JSON bytes (orjson; never a raw line break, so each is one SSE
``data:`` line).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
import orjson

from ...api import ModelInfo
from ...errors import (
    ActorServeError,
    ModelNotFound,
    Overloaded,
    SequenceConflict,
    SequenceNotFound,
    SequenceNotHeld,
)
from ...texttokens import TokenLogprob
from ..errors import client_message, http_status
from .parse import OpenAIError

DONE: Final = b"data: [DONE]\n\n"

_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


@attrs.frozen(slots=True)
class Choice:
    """One finished choice."""

    index: int
    text: str
    finish_reason: str
    #: the tokens' log-probabilities (None: not asked for)
    logprobs: tuple[TokenLogprob, ...] | None = None


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (OpenAI's legacy shape): ``tokens``,
    ``token_logprobs``, ``top_logprobs`` (the token itself and its alternatives) and
    ``text_offset`` (each token's start in the completion's text, from ``offset``)."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [None if e.logprob is None else _finite(e.logprob) for e in entries],
        "top_logprobs": [_top(e) for e in entries],
        "text_offset": offsets,
    }


def _top(entry: TokenLogprob) -> dict[str, float] | None:
    """The token and its alternatives by text; two ids of the same text keep the
    likelier's value (None: a prompt's first token, with ``echo``)."""
    if entry.logprob is None:
        return None
    top = {entry.token: _finite(entry.logprob)}
    for token, logprob in reversed(entry.top):
        top[token] = _finite(logprob)
    return top


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``content``, one entry per token."""

    def one(token: str, logprob: float | None) -> dict[str, Any]:
        return {"token": token, "logprob": _finite(logprob or 0.0), "bytes": list(token.encode())}

    return {
        "content": [
            {**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries
        ],
        "refusal": None,
    }


def _finite(logprob: float) -> float:
    """JSON has no -Infinity: a token the model rules out gets OpenAI's floor."""
    return logprob if logprob > -9999.0 else -9999.0


@attrs.frozen(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


_CODES: Final = {
    ModelNotFound.__name__: "model_not_found",
    SequenceNotFound.__name__: "sequence_not_found",
    # not held by this replica (docs/deploy.md#stickiness): the REST body's reason
    SequenceNotHeld.__name__: SequenceNotHeld.reason,
    SequenceConflict.__name__: "sequence_conflict",
    Overloaded.__name__: "rate_limit_exceeded",
}


def sse(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def error_status_and_body(error: BaseException) -> tuple[int, bytes]:
    """The status and OpenAI-shaped body for anything raised while serving."""
    if isinstance(error, OpenAIError):
        status, message, param, code = error.status, error.message, error.param, error.code
    else:
        status, message, param = http_status(error), client_message(error), None
        code = _CODES.get(type(error).__name__)
        if code is None and not isinstance(error, ActorServeError):
            code = "internal_error"
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return status, orjson.dumps(body)


def model_list(models: Sequence[ModelInfo], created: int) -> bytes:
    return orjson.dumps({"object": "list", "data": [model_object(m.name, created) for m in models]})


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "actorserve"}


def _extra(sequence_id: str | None) -> dict[str, Any]:
    return {} if sequence_id is None else {"sequence_id": sequence_id}


def completion(
    call_id: str, model: str, created: int, choices: Sequence[Choice], usage: Usage, sequence_id: str | None
) -> bytes:
    return orjson.dumps(
        {
            "id": call_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": None if c.logprobs is None else completion_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
                for c in choices
            ],
            "usage": usage.to_json(),
            **_extra(sequence_id),
        }
    )


def chat_completion(
    call_id: str, model: str, created: int, choices: Sequence[Choice], usage: Usage, sequence_id: str | None
) -> bytes:
    return orjson.dumps(
        {
            "id": call_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None if c.logprobs is None else chat_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
                for c in choices
            ],
            "usage": usage.to_json(),
            **_extra(sequence_id),
        }
    )


@attrs.frozen(slots=True)
class ChunkShape:
    """How one stream's chunks look (completions or chat)."""

    call_id: str
    model: str
    created: int
    chat: bool
    include_usage: bool
    sequence_id: str | None = None
    # a text chunk rendered once, around its index and text (the per-token event)
    _text_head: bytes = attrs.field(init=False, repr=False, eq=False)
    _text_open: bytes = attrs.field(init=False, repr=False, eq=False)
    _text_tail: bytes = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        # the keys in _chunk's order; test_templates.py proves the bytes the same
        dumps = orjson.dumps
        kind = b'"chat.completion.chunk"' if self.chat else b'"text_completion"'
        head = b'data: {"id":' + dumps(self.call_id) + b',"object":' + kind
        head += b',"created":' + dumps(self.created) + b',"model":' + dumps(self.model)
        tail = b',"logprobs":null,"finish_reason":null}]'
        if self.chat:
            tail += b',"system_fingerprint":null'
        if self.include_usage:
            tail += b',"usage":null'
        if self.sequence_id is not None:
            tail += b',"sequence_id":' + dumps(self.sequence_id)
        object.__setattr__(self, "_text_head", head + b',"choices":[{"index":')
        object.__setattr__(self, "_text_open", b',"delta":{"content":' if self.chat else b',"text":')
        object.__setattr__(self, "_text_tail", (b"}" if self.chat else b"") + tail + b"}\n\n")

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> bytes:
        doc: dict[str, Any] = {
            "id": self.call_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.chat:
            doc["system_fingerprint"] = None
        if self.include_usage:
            doc["usage"] = None if usage is None else usage.to_json()
        if self.sequence_id is not None:
            doc["sequence_id"] = self.sequence_id
        return sse(orjson.dumps(doc))

    def opening(self, index: int) -> bytes:
        """A chat choice's first chunk (the role); nothing for completions."""
        if not self.chat:
            return b""
        return self._chunk(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )

    def text(self, index: int, text: str) -> bytes:
        return b"".join(
            (self._text_head, b"%d" % index, self._text_open, orjson.dumps(text), self._text_tail)
        )

    def text_slow(
        self,
        index: int,
        text: str,
        logprobs: Sequence[TokenLogprob] | None = None,
        offset: int = 0,
        usage: Usage | None = None,
    ) -> bytes:
        """:meth:`text` built as a document (what the template is tested against), with
        the log-probabilities of its tokens and the usage so far when asked for
        (``offset``: where this text starts in the choice's text)."""
        if self.chat:
            lp = None if logprobs is None else chat_logprobs(logprobs)
            return self._chunk(
                [{"index": index, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}], usage
            )
        lp = None if logprobs is None else completion_logprobs(logprobs, offset)
        return self._chunk([{"index": index, "text": text, "logprobs": lp, "finish_reason": None}], usage)

    def finish(self, index: int, reason: str, usage: Usage | None = None) -> bytes:
        if self.chat:
            return self._chunk(
                [{"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}], usage
            )
        return self._chunk([{"index": index, "text": "", "logprobs": None, "finish_reason": reason}], usage)

    def usage(self, usage: Usage) -> bytes:
        """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
        return self._chunk([], usage)


def stream_error(error: BaseException) -> bytes:
    """An error after the stream started: one ``data:`` event with the error object (the
    ``openai`` client raises it), then the stream ends."""
    return sse(error_status_and_body(error)[1])
