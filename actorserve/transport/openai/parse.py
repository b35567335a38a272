"""OpenAI request bodies, with no I/O: ``/v1/completions`` and ``/v1/chat/completions``
JSON checked and read into :class:`TextCall`, the options of the text-generation
contract plus what the route itself needs (choices, streaming, usage).

Every parameter OpenAI defines that we do not implement is refused with an
:class:`OpenAIError` naming it (400), unless it has its neutral value (``logprobs:
null``, ``presence_penalty: 0``, ...), so a client never gets silently different
behaviour. Unknown keys are refused the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ...api import bool_parameter, no_sequence_id, no_sequence_text
from ...errors import BadInput
from ...limits import MAX_CHAT_MESSAGES
from ...textgen import MAX_TOP_LOGPROBS, TextOptions

#: at most this many choices per request (``n`` times the prompts)
MAX_CHOICES: Final = 64
MAX_STOP: Final = 16
#: the largest ``top_k`` (a vocabulary is smaller; past it the model takes every token)
MAX_TOP_K: Final = 1 << 20
_STREAM_OPTIONS: Final = frozenset({"include_usage", "continuous_usage_stats"})

#: OpenAI parameters (and vLLM's and TGI's sampling extensions, which benchmark clients
#: send on every request) we do not implement, each with the values that mean "not used"
_NEUTRAL: Final[dict[str, tuple[Any, ...]]] = {
    "echo": (None, False),
    "repetition_penalty": (None, 1, 1.0),
    "length_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "typical_p": (None, 1, 1.0),
    "use_beam_search": (None, False),
    "skip_special_tokens": (None, True),
    # with special tokens skipped there is nothing for it to change
    "spaces_between_special_tokens": (None, True, False),
    "include_stop_str_in_output": (None, False),
    "stop_token_ids": (None, []),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "truncate_prompt_tokens": (None,),
    "return_tokens_as_token_ids": (None, False),
    "detokenize": (None, True),
    "priority": (None, 0),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None, {}),
    "web_search_options": (None,),
}

_COMMON: Final = frozenset(
    {
        *(
            "model",
            "max_tokens",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "n",
            "user",
            "stream",
            "stream_options",
            "top_k",
            "min_tokens",
            "ignore_eos",
            "logprobs",
        ),
        *("sequence_id", "sequence_start", "sequence_end"),
    }
)
_COMPLETION_KEYS: Final = _COMMON | {"prompt", "echo"}
_CHAT_KEYS: Final = _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
_ROLES: Final = frozenset({"system", "developer", "user", "assistant"})


class OpenAIError(Exception):
    """A request refused with OpenAI's error shape: ``status``, ``message``, ``param``,
    ``code`` (``type`` follows from the status)."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


def _bad(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(message, param=param, code=code)


@attrs.frozen(slots=True)
class TextCall:
    """One checked request: ``prompts`` (completions) or ``messages`` (chat), each
    prompt answered ``n`` times; ``options`` for the contract (the seed of choice i is
    ``seed + i``)."""

    model: str
    options: TextOptions
    prompts: tuple[str, ...] = ()
    messages: tuple[Mapping[str, str], ...] = ()
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    #: every stream chunk carries the usage so far (vLLM's ``continuous_usage_stats``)
    continuous_usage: bool = False
    #: completions: each choice's text starts with its prompt (and, with ``logprobs``, the
    #: log-probabilities start with the prompt's tokens': ``options.echo``)
    echo: bool = False


def _number(obj: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"'{key}' must be a number", key, "invalid_type")
    if not low <= value <= high:
        raise _bad(f"'{key}' must be between {low:g} and {high:g}, got {value}", key)
    return float(value)


def _integer(obj: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{key}' must be an integer", key, "invalid_type")
    if value < low or (high is not None and value > high):
        raise _bad(
            f"'{key}' must be {'>= ' + str(low) if high is None else f'between {low} and {high}'}, got {value}",
            key,
        )
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise _bad("'stop' must be a non-empty string or a list of them", "stop", "invalid_type")
    if len(values) > MAX_STOP:
        raise _bad(f"'stop' takes at most {MAX_STOP} strings", "stop")
    return tuple(values)


def _same(value: Any, neutral: Any) -> bool:
    """``value`` is ``neutral`` in JSON's types: ``true`` is no 1, ``0`` no ``false``, ``"1"``
    no 1 (Python's ``==`` would say so); 1 and 1.0 are one number."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(value, int | float) and isinstance(neutral, int | float):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


def _check_keys(obj: Mapping[str, Any], known: frozenset[str]) -> None:
    for key, value in obj.items():
        if key in known:
            continue
        if key in _NEUTRAL:
            if not any(_same(value, neutral) for neutral in _NEUTRAL[key]):
                raise _bad(f"'{key}' is not supported by this server", key, "unsupported_parameter")
            continue
        raise _bad(f"unrecognized request argument: {key!r}", key, "unsupported_parameter")


def _sequence(obj: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """``sequence_id/start/end`` from the body (``extra_body``) or the ``sequence-*``
    headers (as for the OIP); a header that disagrees with the body is an error."""
    out: dict[str, Any] = {}
    for name in ("sequence_id", "sequence_start", "sequence_end"):
        value = obj.get(name)
        header = headers.get(name.replace("_", "-"))
        if header is not None and name == "sequence_id" and no_sequence_text(header.strip()):
            header = None
        if header is not None and value is not None:
            same = (
                str(value) == header.strip()
                if name == "sequence_id"
                else _flag(value, name) == _flag(header, name)
            )
            if not same:
                raise _bad(
                    f"header {name.replace('_', '-')!r} ({header!r}) disagrees with {name!r} ({value!r})",
                    name,
                )
        value = value if value is not None else header
        if value is None:
            continue
        if name == "sequence_id":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise _bad("'sequence_id' must be an integer or a string", name, "invalid_type")
            if not no_sequence_id(value):
                out[name] = value.strip() if isinstance(value, str) else value
        else:
            out[name] = _flag(value, name)
    return out


def _boolean(value: Any, name: str) -> bool:
    """A JSON ``true`` / ``false`` (no other spelling: a body is JSON, not a header)."""
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be true or false", name, "invalid_type")
    return value


def _flag(value: Any, name: str) -> bool:
    try:
        return bool_parameter(value, name)
    except BadInput as exc:
        raise _bad(exc.message, name, "invalid_type") from None


def _call(
    obj: Mapping[str, Any],
    headers: Mapping[str, str],
    max_tokens: int | None,
    logprobs: int | None,
    **fields: Any,
) -> TextCall:
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(
            "'model' is required (a model name; see GET /v1/models)", "model", "missing_required_parameter"
        )
    user = obj.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("'user' must be a string", "user", "invalid_type")
    stream = _flag(obj.get("stream") or False, "stream")
    include_usage = continuous_usage = False
    stream_options = obj.get("stream_options")
    if stream_options is not None:
        if not stream:
            raise _bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        if not isinstance(stream_options, Mapping) or set(stream_options) - _STREAM_OPTIONS:
            raise _bad(
                "'stream_options' supports only 'include_usage' and 'continuous_usage_stats'",
                "stream_options",
                "unsupported_parameter",
            )
        include_usage = _flag(stream_options.get("include_usage") or False, "stream_options.include_usage")
        continuous_usage = _boolean(
            stream_options.get("continuous_usage_stats") or False, "stream_options.continuous_usage_stats"
        )
    n = _integer(obj, "n", 1, MAX_CHOICES) or 1
    sequence = _sequence(obj, headers)
    if sequence and n > 1:
        raise _bad("a request in a sequence has one choice ('n': 1)", "n")
    top_k = _integer(obj, "top_k", -1, MAX_TOP_K)
    ignore_eos = obj.get("ignore_eos")
    options = TextOptions(
        max_tokens=max_tokens,
        temperature=_number(obj, "temperature", 0.0, 2.0),
        top_p=_number(obj, "top_p", 0.0, 1.0),
        seed=_integer(obj, "seed", -(2**63), 2**64 - 1),
        # vLLM's -1 (and 0) is no limit, as the contract's 0
        top_k=None if top_k is None else max(top_k, 0),
        min_tokens=_integer(obj, "min_tokens", 0, max_tokens),
        ignore_eos=None if ignore_eos is None else _boolean(ignore_eos, "ignore_eos"),
        logprobs=logprobs,
        stop=_stop(obj.get("stop")),
        sequence=sequence,
    )
    return TextCall(
        model=model,
        options=options,
        n=n,
        stream=stream,
        include_usage=include_usage or continuous_usage,
        continuous_usage=continuous_usage,
        **fields,
    )


def parse_completion(obj: Any, headers: Mapping[str, str]) -> TextCall:
    """A ``/v1/completions`` body (``headers``: lower-case names)."""
    if not isinstance(obj, Mapping):
        raise OpenAIError("the request body must be a JSON object")
    _check_keys(obj, _COMPLETION_KEYS)
    prompt = obj.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise _bad("'prompt' must be a string or a list of strings (token ids are not supported)", "prompt")
    # completions: ``logprobs`` is how many alternatives each token lists (0: only its own)
    logprobs = _integer(obj, "logprobs", 0, MAX_TOP_LOGPROBS)
    echo = _boolean(obj.get("echo") or False, "echo")
    call = _call(obj, headers, _integer(obj, "max_tokens", 0), logprobs, prompts=tuple(prompts), echo=echo)
    if echo and logprobs is not None:  # the model scores the prompt
        call = attrs.evolve(call, options=attrs.evolve(call.options, echo=True))
    if call.options.sequence and (len(prompts) > 1 or echo):
        raise _bad("a request in a sequence has one prompt and no 'echo'", "prompt")
    if len(prompts) * call.n > MAX_CHOICES:
        raise _bad(f"at most {MAX_CHOICES} choices per request (prompts times 'n')", "n")
    return call


def _content(message: Mapping[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise _bad(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def parse_chat(obj: Any, headers: Mapping[str, str]) -> TextCall:
    """A ``/v1/chat/completions`` body (``headers``: lower-case names)."""
    if not isinstance(obj, Mapping):
        raise OpenAIError("the request body must be a JSON object")
    _check_keys(obj, _CHAT_KEYS)
    messages = _messages(obj)
    limit = _integer(obj, "max_completion_tokens", 0)
    if limit is None:
        limit = _integer(obj, "max_tokens", 0)
    # chat: ``logprobs`` is a flag, ``top_logprobs`` how many alternatives each token lists
    wanted = _boolean(obj.get("logprobs") or False, "logprobs")
    top = _integer(obj, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return _call(obj, headers, limit, (top or 0) if wanted else None, messages=messages)


def _messages(obj: Mapping[str, Any]) -> tuple[Mapping[str, str], ...]:
    """``messages``, checked: each ``{"role", "content"}`` (text)."""
    raw = obj.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list", "messages", "missing_required_parameter")
    if len(raw) > MAX_CHAT_MESSAGES:
        message = f"'messages' has {len(raw)} messages, at most {MAX_CHAT_MESSAGES} are allowed"
        raise _bad(f"{message} (limit MAX_CHAT_MESSAGES; see docs/security.md#limits)", "messages")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, Mapping):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]")
        extra = set(message) - {"role", "content", "name"}
        if extra:
            raise _bad(
                f"messages[{i}]: {sorted(extra)[0]!r} is not supported",
                f"messages[{i}].{sorted(extra)[0]}",
                "unsupported_parameter",
            )
        role = message.get("role")
        if role not in _ROLES:
            raise _bad(
                f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}", f"messages[{i}].role"
            )
        messages.append({"role": str(role), "content": _content(message, i)})
    return tuple(messages)
