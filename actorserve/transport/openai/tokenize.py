"""vLLM's tokenizer routes, with no I/O: ``/tokenize`` and ``/detokenize`` bodies
checked and read, and the ``/tokenize`` answer built from the model's
(:mod:`actorserve.texttokens`). Errors are :class:`~.parse.OpenAIError` (400)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from ...textgen import element_text
from ...texttokens import TOKEN_IDS, TOKEN_STRS
from ...types import InferenceResponse
from .parse import OpenAIError, _bad, _check_keys, _flag, _messages

#: the most token ids one ``/detokenize`` request may carry
MAX_DETOKENIZE: Final = 1 << 20


@attrs.frozen(slots=True)
class TokenizeCall:
    """A checked ``/tokenize`` body (vLLM's): ``prompt`` text, or chat ``messages``
    rendered with ``add_generation_prompt``; ``model`` None: the only model that
    tokenizes."""

    model: str | None
    prompt: str | None
    messages: tuple[Mapping[str, str], ...] | None
    add_generation_prompt: bool
    add_special_tokens: bool
    token_strs: bool


def _optional_model(obj: Mapping[str, Any]) -> str | None:
    model = obj.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise _bad("'model' must be a model name", "model", "invalid_type")
    return model


def parse_tokenize(obj: Any) -> TokenizeCall:
    """A ``/tokenize`` body: ``{"model"?, "prompt", "add_special_tokens"?,
    "return_token_strs"?}`` or ``{"model"?, "messages", "add_generation_prompt"?,
    "add_special_tokens"?, "return_token_strs"?}`` (vLLM's defaults: special tokens added
    to a prompt, not to a rendered chat, whose template has its own)."""
    if not isinstance(obj, Mapping):
        raise OpenAIError("the request body must be a JSON object")
    chat = "messages" in obj
    known = {"model", "add_special_tokens", "return_token_strs"}
    known |= {"messages", "add_generation_prompt"} if chat else {"prompt"}
    _check_keys(obj, frozenset(known))
    messages = None
    prompt = obj.get("prompt")
    if chat:
        messages = _messages(obj)
    elif not isinstance(prompt, str):
        raise _bad("'prompt' must be a string (or send 'messages')", "prompt", "invalid_type")
    return TokenizeCall(
        _optional_model(obj),
        None if chat else prompt,
        messages,
        _flag(obj.get("add_generation_prompt", True), "add_generation_prompt"),
        _flag(obj.get("add_special_tokens", not chat), "add_special_tokens"),
        _flag(obj.get("return_token_strs") or False, "return_token_strs"),
    )


def parse_detokenize(obj: Any) -> tuple[str | None, list[int]]:
    """A ``/detokenize`` body ``{"model"?, "tokens": [ids]}``: the model and the ids."""
    if not isinstance(obj, Mapping):
        raise OpenAIError("the request body must be a JSON object")
    _check_keys(obj, frozenset({"model", "tokens"}))
    tokens = obj.get("tokens")
    if not isinstance(tokens, list):
        raise _bad("'tokens' must be a list of token ids", "tokens", "invalid_type")
    if len(tokens) > MAX_DETOKENIZE:
        raise _bad(f"'tokens' holds at most {MAX_DETOKENIZE} ids", "tokens")
    if not all(type(t) is int and 0 <= t < 2**63 for t in tokens):
        raise _bad("'tokens' must be a list of token ids (integers >= 0)", "tokens", "invalid_type")
    return _optional_model(obj), tokens


def tokenize_payload(response: InferenceResponse) -> dict[str, Any]:
    """vLLM's ``/tokenize`` answer from a model's (:func:`~actorserve.textgen.tokenize_request`):
    ``count``, ``max_model_len``, ``tokens`` and, when asked, ``token_strs``."""
    ids: list[int] = []
    strings: list[str] | None = None
    for tensor in response.outputs:
        if tensor.name == TOKEN_IDS:
            ids = [int(i) for i in tensor.data.reshape(-1)]
        elif tensor.name == TOKEN_STRS:
            strings = [element_text(v) for v in tensor.data.reshape(-1)]
    payload: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": int(response.parameters.get("max_context", 0)),
        "tokens": ids,
    }
    if strings is not None:
        payload["token_strs"] = strings
    return payload
