"""What a request asks of the ``transformers`` runtime, read and checked before it
joins a batch (no model calls here; :mod:`.runtime` is the model): its prompt (its one
``text_input``, or TorchServe's body), its sampling options, a chat turn's new messages,
and the answer to a tokenizer request (:mod:`actorserve.texttokens`).

Every value is checked for its type and range before it is used; every refusal is a
:class:`~actorserve.errors.BadInput` naming what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs
import numpy as np

from ...api import bool_parameter
from ...chattemplate import render_messages
from ...errors import BadInput
from ...limits import MAX_CHAT_MESSAGES
from ...model import float_parameter, int_parameter
from ...textgen import MAX_TOP_LOGPROBS, MESSAGES_PARAMETER, SAMPLING_OPTIONS, TextGeneration
from ...texttokens import TOKEN_IDS, TOKEN_STRS
from ...types import InferenceRequest, Tensor
from ..textlm.generation import DEFAULT_MAX_TOKENS, GENERATION_PARAMETERS, request_seed, stop_strings
from .state import LLMState
from .torchserve import TS_BODY, from_torchserve

#: the inputs it takes: the prompt, TorchServe's body, and the ids of a detokenize request
INPUTS: Final = ("text_input", TS_BODY, TOKEN_IDS)
#: what the runtime takes beyond the ``text`` model's parameters: vLLM's ``min_tokens`` /
#: ``ignore_eos``, ``logprobs`` (alternatives per token), a chat turn's ``messages``
#: (textgen.MESSAGES_PARAMETER), and the tokenizer requests of :mod:`actorserve.texttokens`
PARAMETERS: Final = GENERATION_PARAMETERS | {
    "min_tokens",
    "ignore_eos",
    "logprobs",
    "echo",
    MESSAGES_PARAMETER,
    "tokenize",
    "detokenize",
    "add_special_tokens",
    TOKEN_STRS,
}
#: its text-generation declaration: every sampling option, stop strings and usage of its
#: own, vLLM's tokenizer routes, and a sequence's conversation rendered whole each turn
LLM_TEXT_GENERATION: Final = TextGeneration(
    sampling=SAMPLING_OPTIONS, stop=True, usage=True, tokenize=True, chat_history=True
)
#: the sampling of a request that generates nothing (a tokenizer request)
NO_SAMPLING: Final[dict[str, Any]] = {
    "max_tokens": 0,
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": 0,
    "stop": (),
}


def text_bytes(text: str) -> np.ndarray[Any, np.dtype[Any]]:
    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return data


def request_prompt(
    request: InferenceRequest, model: str, known: frozenset[str]
) -> tuple[InferenceRequest, str]:
    """The request (TorchServe's body read into its parameters) and its prompt ("" when
    it has none). An input the runtime does not read is refused, never taken for an
    empty prompt."""
    for given in request.inputs:
        if given.name not in INPUTS:
            raise BadInput(f"model {model!r} has no input {given.name!r} (expected 'text_input')")
    tensor = request.input("text_input", required=False)
    body = request.input(TS_BODY, required=False) if tensor is None else None
    if body is not None:
        request, tensor = from_torchserve(request, body, model, known)
    if tensor is None:
        return request, ""
    if tensor.datatype != "BYTES" or tensor.data.size != 1:
        raise BadInput(
            f"input 'text_input': expected BYTES with shape [1], got {tensor.datatype} {list(tensor.shape)}"
        )
    value = tensor.data.reshape(-1)[0]
    return request, value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


@attrs.frozen(slots=True)
class Sampling:
    """How one request generates (the keyword arguments of :class:`~.state.LLMWork`)."""

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: tuple[str, ...]
    #: EOS cannot be drawn, and stop strings are not looked for, before this many tokens
    min_tokens: int
    #: EOS is a token like any other (only max_tokens, stop strings and the context end it)
    ignore_eos: bool
    #: alternatives listed per generated token (None: no log-probabilities)
    logprobs: int | None
    #: every response carries the token counts so far
    usage: bool


def read_sampling(request: InferenceRequest, max_tokens_limit: int) -> Sampling:
    """The request's generation parameters (docs/llm.md#requests), checked."""
    params = request.parameters
    max_tokens = int_parameter(request, "max_tokens", DEFAULT_MAX_TOKENS, minimum=0, maximum=max_tokens_limit)
    logprobs: int | None = None
    if params.get("logprobs") is not None:
        logprobs = int_parameter(request, "logprobs", 0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    return Sampling(
        max_tokens=max_tokens,
        temperature=float_parameter(request, "temperature", 1.0, minimum=0.0),
        top_k=int_parameter(request, "top_k", 0, minimum=0),
        top_p=float_parameter(request, "top_p", 1.0, minimum=0.0, maximum=1.0),
        seed=request_seed(request),
        stop=stop_strings(request),
        min_tokens=int_parameter(request, "min_tokens", 0, minimum=0, maximum=max_tokens),
        ignore_eos=bool_parameter(params.get("ignore_eos", False), "ignore_eos"),
        logprobs=logprobs,
        usage=bool_parameter(params.get("usage", False), "usage"),
    )


def context_text(
    params: Mapping[str, Any], prompt: str, state: LLMState, model: str, template: str
) -> tuple[str, list[dict[str, str]] | None]:
    """The text of a request's whole context and, for a chat turn (the ``messages``
    parameter), the conversation it answers: the sequence's messages and the new ones,
    rendered whole as a request without a sequence renders them. A sequence that is a
    conversation takes only chat turns."""
    if params.get(MESSAGES_PARAMETER) is not None:
        messages = [
            *(state.messages or []),
            *chat_turn(params[MESSAGES_PARAMETER], prompt, state, model, template),
        ]
        return render_messages(template, messages), messages
    if state.messages is not None:
        raise BadInput(
            f"sequence {state.sequence_id!r} is a conversation: its turns are chat messages (/v1/chat/completions)"
        )
    return state.text + prompt, None


def echo_of(request: InferenceRequest, state: LLMState) -> bool:
    """Whether a request asks for its prompt's log-probabilities (``echo`` with
    ``logprobs``; a request without a sequence)."""
    params = request.parameters
    if not bool_parameter(params.get("echo", False), "echo"):
        return False
    if params.get("logprobs") is None or state.sequence_id is not None:
        raise BadInput("parameter 'echo': needs 'logprobs', in a request without a sequence")
    return True


def chat_turn(value: object, prompt: str, state: LLMState, model: str, template: str) -> list[dict[str, str]]:
    """A chat turn's new messages (the ``messages`` parameter: a JSON list of
    ``{"role", "content"}``), for a sequence that is a conversation (or a new one)."""
    if prompt:
        raise BadInput(f"parameter {MESSAGES_PARAMETER!r}: a chat turn has no 'text_input'")
    if not template:
        raise BadInput(f"model {model!r} has no chat template")
    if state.text and state.messages is None:
        raise BadInput(f"sequence {state.sequence_id!r} holds plain text, not a conversation")
    try:
        turn = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        turn = None
    if not isinstance(turn, list) or not turn:
        raise BadInput(f"parameter {MESSAGES_PARAMETER!r}: expected a JSON list of messages")
    if len(turn) + len(state.messages or ()) > MAX_CHAT_MESSAGES:
        raise BadInput(
            f"parameter {MESSAGES_PARAMETER!r}: the conversation would hold more than {MAX_CHAT_MESSAGES} "
            "messages (limit MAX_CHAT_MESSAGES; see docs/security.md#limits)"
        )
    messages = []
    for message in turn:
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or not all(isinstance(v, str) for v in message.values())
        ):
            raise BadInput(
                f"parameter {MESSAGES_PARAMETER!r}: each message is {{'role': str, 'content': str}}"
            )
        messages.append(message)
    return messages


def tokenizer_outputs(request: InferenceRequest, tokenizer: Any, prompt: str) -> list[Tensor]:
    """The answer to a detokenize request (``text_output``: the ids' text, special tokens
    included) or a tokenize request (``token_ids``, and ``token_strs`` when asked)."""
    params = request.parameters
    if params.get("detokenize"):
        tensor = request.input(TOKEN_IDS, required=False)
        if tensor is None or tensor.datatype not in ("INT64", "INT32") or len(tensor.shape) != 1:
            raise BadInput(f"a detokenize request has the input {TOKEN_IDS!r} (INT64 [n])")
        ids = [int(i) for i in tensor.data.reshape(-1)]
        if any(not 0 <= i < len(tokenizer) for i in ids):
            raise BadInput(f"input {TOKEN_IDS!r}: a token id is not in [0, {len(tokenizer)})")
        return [Tensor("text_output", (1,), "BYTES", text_bytes(str(tokenizer.decode(ids))))]
    special = bool_parameter(params.get("add_special_tokens", True), "add_special_tokens")
    ids = [int(i) for i in tokenizer(prompt, add_special_tokens=special)["input_ids"]]
    outputs = [Tensor(TOKEN_IDS, (len(ids),), "INT64", np.asarray(ids, dtype=np.int64))]
    if bool_parameter(params.get(TOKEN_STRS, False), TOKEN_STRS):
        strings = np.empty(len(ids), dtype=object)
        strings[:] = [str(t).encode() for t in tokenizer.convert_ids_to_tokens(ids)]
        outputs.append(Tensor(TOKEN_STRS, (len(ids),), "BYTES", strings))
    return outputs
