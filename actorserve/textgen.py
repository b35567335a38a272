"""The text-generation contract: what a model declares so that every text front door
(Triton's generate extension, the OpenAI API) can drive it the same way.

A model that generates text takes a prompt in one BYTES [1] input and streams text
pieces in one BYTES output, one response per piece. :class:`TextGeneration` (a model
class attribute, overridden by the ``text_generation`` block of model-settings.json)
names that input and output, the request parameter that bounds the tokens generated,
which sampling parameters the model takes, whether it applies ``stop`` strings itself
and whether it reports token counts, and its chat template.

The rest of this module is the two halves of the contract with no I/O:
:func:`text_request` turns a prompt and its options into an engine request, and
:class:`TextPieces` reads the responses back as text, applying ``stop`` strings when the
model does not and keeping the token counts and the finish reason.

Token counts: a model with ``usage`` puts ``prompt_tokens`` and ``completion_tokens``
(its own tokens) in the parameters of its last response when a request asks with the
parameter ``usage: true``; for any other model each streamed piece counts as one token
and the prompt as none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import numpy as np

from .errors import BadInput
from .texttokens import LOGPROBS_PARAMETER, TokenLogprob, logprobs_from_parameter
from .types import InferenceRequest, InferenceResponse, Tensor

#: the sampling options a front door may pass (when the model declares them):
#: ``top_k`` (0: no limit), ``min_tokens`` (EOS and stop strings wait that many
#: tokens), ``ignore_eos`` (only max_tokens and stop strings end the text) and
#: ``logprobs`` (the log-probability of each token and of its ``logprobs`` most likely
#: alternatives, see :class:`~actorserve.texttokens.TokenLogprob`) and ``echo`` (with
#: ``logprobs``: the prompt's own tokens come first, with theirs)
SAMPLING_OPTIONS: Final = (
    "temperature",
    "top_p",
    "seed",
    "top_k",
    "min_tokens",
    "ignore_eos",
    "logprobs",
    "echo",
)
#: an option at its value here asks for nothing, so it passes whether or not the model
#: takes it (``top_p: 1`` is no limit)
NEUTRAL_OPTIONS: Final[dict[str, object]] = {
    "top_p": 1.0,
    "top_k": 0,
    "min_tokens": 0,
    "ignore_eos": False,
    "echo": False,
}
#: the most alternatives per token ``logprobs`` may ask for (OpenAI's limit)
MAX_TOP_LOGPROBS: Final = 20
#: finish reasons: the model (or a stop string) ended the text, or max_tokens did
FINISH_STOP: Final = "stop"
FINISH_LENGTH: Final = "length"

_KEYS: Final = frozenset(
    {
        "input",
        "output",
        "max_tokens",
        "sampling",
        "stop",
        "usage",
        "chat_template",
        "chat_stop",
        "tokenize",
        "chat_history",
    }
)


class UnsupportedOption(BadInput):
    """A request asks for a sampling option (:data:`SAMPLING_OPTIONS`) its model does not
    take; ``option`` names it."""

    def __init__(self, option: str) -> None:
        super().__init__(f"parameter {option!r} is not supported by this model")
        self.option = option


@attrs.frozen(slots=True)
class TextGeneration:
    """A model's text-generation declaration.

    ``input`` / ``output``: its BYTES [1] prompt input and text output; ``max_tokens``:
    the request parameter bounding the tokens generated; ``sampling``: the options of
    :data:`SAMPLING_OPTIONS` it takes (as parameters of those names); ``stop``: it applies
    ``stop`` strings itself (otherwise :class:`TextPieces` does); ``usage``: it reports
    token counts when asked; ``chat_template``: a Jinja2 template turning ``messages``
    into a prompt ("" = no chat); ``chat_stop``: stop strings every chat request gets
    (the end of a turn in the template); ``tokenize``: it answers :func:`tokenize_request`
    and :func:`detokenize_request`; ``chat_history``: in a sequence it keeps the
    conversation's messages and renders all of them with its template each turn (a
    chat request then sends only its new messages, as :data:`MESSAGES_PARAMETER`), so a
    template that is not the concatenation of its turns (a BOS once, a closed assistant
    turn) reads the same tokens as the whole history sent without a sequence."""

    input: str = "text_input"
    output: str = "text_output"
    max_tokens: str = "max_tokens"
    sampling: tuple[str, ...] = ()
    stop: bool = False
    usage: bool = False
    chat_template: str = ""
    chat_stop: tuple[str, ...] = ()
    tokenize: bool = False
    chat_history: bool = False

    def __attrs_post_init__(self) -> None:
        unknown = set(self.sampling) - set(SAMPLING_OPTIONS)
        if unknown:
            raise BadInput(
                f"text_generation.sampling: unknown option(s) {sorted(unknown)}; known: {list(SAMPLING_OPTIONS)}"
            )

    def with_settings(self, block: Mapping[str, Any], where: str = "text_generation") -> TextGeneration:
        """This declaration with the keys of a settings block replaced; :class:`BadInput`."""
        if not isinstance(block, Mapping):
            raise BadInput(f"{where}: expected an object")
        unknown = set(block) - _KEYS
        if unknown:
            raise BadInput(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}"
            )
        changes: dict[str, Any] = {}
        for key, value in block.items():
            if key in ("stop", "usage", "tokenize", "chat_history"):
                if not isinstance(value, bool):
                    raise BadInput(f"{where}.{key}: expected true or false")
            elif key in ("sampling", "chat_stop"):
                if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                    raise BadInput(f"{where}.{key}: expected a list of strings")
                value = tuple(value)
            elif not isinstance(value, str) or (not value and key != "chat_template"):
                raise BadInput(f"{where}.{key}: expected a string")
            changes[key] = value
        return attrs.evolve(self, **changes)

    def to_plain(self) -> list[Any]:
        """As plain values (the engine process sends it to the fronts)."""
        return [
            self.input,
            self.output,
            self.max_tokens,
            list(self.sampling),
            self.stop,
            self.usage,
            self.chat_template,
            list(self.chat_stop),
            self.tokenize,
            self.chat_history,
        ]

    @classmethod
    def from_plain(cls, plain: Any) -> TextGeneration:
        name_in, name_out, max_tokens, sampling, stop, usage, template, chat_stop, tokenize, history = plain
        return cls(
            str(name_in),
            str(name_out),
            str(max_tokens),
            tuple(map(str, sampling)),
            bool(stop),
            bool(usage),
            str(template),
            tuple(map(str, chat_stop)),
            bool(tokenize),
            bool(history),
        )


@attrs.frozen(slots=True)
class TextOptions:
    """How to generate: the front door's options in the contract's terms. ``None``
    leaves an option to the model's default; ``sequence`` holds ``sequence_id`` /
    ``sequence_start`` / ``sequence_end`` parameters (empty: no sequence)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    top_k: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = None
    echo: bool | None = None
    stop: tuple[str, ...] = ()
    sequence: Mapping[str, Any] = attrs.field(factory=dict)


def text_tensor(name: str, text: str) -> Tensor:
    """A BYTES [1] tensor holding ``text`` (UTF-8)."""
    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return Tensor(name, (1,), "BYTES", data)


def text_request(
    spec: TextGeneration, prompt: str, options: TextOptions, request_id: str | None = None
) -> InferenceRequest:
    """The engine request generating from ``prompt``. An option the model does not take
    is :class:`BadInput` naming it (an option at its neutral value always passes:
    :data:`NEUTRAL_OPTIONS`), so nothing a client asked for is silently ignored."""
    parameters: dict[str, Any] = dict(options.sequence)
    if options.max_tokens is not None:
        parameters[spec.max_tokens] = options.max_tokens
    for name in SAMPLING_OPTIONS:
        value = getattr(options, name)
        if value is None or (name not in spec.sampling and NEUTRAL_OPTIONS.get(name, ()) == value):
            continue
        if name not in spec.sampling:
            raise UnsupportedOption(name)
        parameters[name] = value
    if options.stop and spec.stop:
        parameters["stop"] = list(options.stop)
    if spec.usage:
        parameters["usage"] = True
    return InferenceRequest(inputs=[text_tensor(spec.input, prompt)], id=request_id, parameters=parameters)


#: the request parameter carrying a chat turn's new messages (a JSON list of
#: ``{"role", "content"}``) to a model that keeps a sequence's conversation
#: (``chat_history``); its ``text_input`` is then empty
MESSAGES_PARAMETER: Final = "messages"


def chat_turn_request(
    spec: TextGeneration, messages: Sequence[Mapping[str, str]], options: TextOptions
) -> InferenceRequest:
    """A chat turn for a model with ``chat_history``: its new ``messages`` (the model
    renders the sequence's whole conversation itself)."""
    request = text_request(spec, "", options)
    request.parameters[MESSAGES_PARAMETER] = json.dumps([dict(m) for m in messages])
    return request


def merged_text(responses: Sequence[InferenceResponse]) -> tuple[Tensor, dict[str, Any]]:
    """A text stream's responses as one answer (a text model's ``merge``): its
    ``text_output``, BYTES [1] holding the texts joined, and the last response's
    parameters (the finish reason and usage are the last one's)."""
    data = np.empty(1, dtype=object)
    data[0] = b"".join(r.outputs[0].data[0] for r in responses if r.outputs)
    parameters = dict(responses[-1].parameters) if responses else {}
    return Tensor("text_output", (1,), "BYTES", data), parameters


def element_text(value: object) -> str:
    """One BYTES element as text (UTF-8, undecodable bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def response_text(response: InferenceResponse, output: str) -> str:
    """The text of ``output`` in one response ("" when absent)."""
    for tensor in response.outputs:
        if tensor.name == output:
            return "".join(element_text(v) for v in tensor.data.reshape(-1))
    return ""


class TextPieces:
    """Reads one generation's responses as text pieces.

    :meth:`feed` returns the text to pass on now ("" while text that may begin a stop
    string is held back); once :attr:`done` is set (a stop string was produced) the
    caller stops reading and leaves the stream, which frees the batch slot. At the end,
    :meth:`close` returns any held-back text. :attr:`finish_reason`,
    :attr:`prompt_tokens` and :attr:`completion_tokens` are then final.
    """

    __slots__ = (
        "_held",
        "_logprobs",
        "_max_tokens",
        "_reason",
        "_reported",
        "_stops",
        "completion_tokens",
        "done",
        "finish_reason",
        "output",
        "prompt_tokens",
    )

    def __init__(
        self, spec: TextGeneration, stop: tuple[str, ...] = (), max_tokens: int | None = None
    ) -> None:
        self.output = spec.output
        self._max_tokens = max_tokens
        self._stops = () if spec.stop else stop  # a model that stops by itself needs no help
        self._held = ""
        self._reported = False
        self.done = False
        self._reason: str | None = None
        self.finish_reason = FINISH_STOP
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._logprobs: list[TokenLogprob] = []

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log-probabilities of the tokens read since the last call (a model that
        reports them with ``logprobs``; empty otherwise)."""
        taken, self._logprobs = self._logprobs, []
        return taken

    def feed(self, response: InferenceResponse) -> str:
        """The text of one more response that may be passed on now."""
        if self.done:
            return ""
        text = response_text(response, self.output)
        params = response.parameters
        if "completion_tokens" in params:
            self.prompt_tokens = int(params.get("prompt_tokens", 0))
            self.completion_tokens = int(params["completion_tokens"])
            self._reported = True
        elif text and not self._reported:
            self.completion_tokens += 1
        if LOGPROBS_PARAMETER in params:
            self._logprobs.extend(logprobs_from_parameter(params[LOGPROBS_PARAMETER]))
        reason = params.get("finish_reason")
        if reason in (FINISH_STOP, FINISH_LENGTH):
            self._reason = self.finish_reason = reason
        if not self._stops:
            return text
        text = self._held + text
        ats = [at for stop in self._stops if (at := text.find(stop)) >= 0]
        if ats:
            self.done = True
            self.finish_reason = FINISH_STOP
            self._held = ""
            return text[: min(ats)]
        keep = longest_stop_prefix(text, self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def close(self) -> str:
        """The held-back text, once the stream has ended; settles :attr:`finish_reason`
        (for a model that does not say: ``length`` when it produced ``max_tokens``)."""
        if not self.done and self._reason is None:
            limit = self._max_tokens
            self.finish_reason = (
                FINISH_LENGTH if limit is not None and self.completion_tokens >= limit else FINISH_STOP
            )
        held, self._held = self._held, ""
        return held


def longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of a stop
    string (those characters are held back)."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
