"""What a text model says about its tokens, beside the text-generation contract
(:mod:`actorserve.textgen`), with no I/O: tokenizer requests (vLLM's ``/tokenize`` and
``/detokenize``) and the log-probabilities of generated tokens, which travel as one
JSON string parameter per response so that every door and the engine link carry them
unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np

from .errors import BadInput
from .types import InferenceRequest, Tensor

#: the token ids of :func:`tokenize_request`'s answer and :func:`detokenize_request`'s input
TOKEN_IDS: Final = "token_ids"
#: the token strings of :func:`tokenize_request`'s answer (when asked)
TOKEN_STRS: Final = "token_strs"
#: the response parameter carrying the log-probabilities of the tokens of a response
LOGPROBS_PARAMETER: Final = "logprobs"


def _text_tensor(name: str, text: str) -> Tensor:
    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return Tensor(name, (1,), "BYTES", data)


def tokenize_request(
    input_name: str, text: str, *, add_special_tokens: bool, strings: bool
) -> InferenceRequest:
    """Ask a model with ``tokenize`` (``TextGeneration.tokenize``; ``input_name``: its
    prompt input) for the tokens of ``text``: it answers ``token_ids``
    (INT64 [n]), with ``strings`` also ``token_strs`` (BYTES [n]), and the parameter
    ``max_context`` (its longest context in tokens)."""
    parameters: dict[str, Any] = {"tokenize": True, "add_special_tokens": add_special_tokens}
    if strings:
        parameters[TOKEN_STRS] = True
    return InferenceRequest(inputs=[_text_tensor(input_name, text)], parameters=parameters)


def detokenize_request(ids: Sequence[int]) -> InferenceRequest:
    """Ask a model with ``tokenize`` for the text of ``ids`` (its ``output``, special
    tokens included, as vLLM's ``/detokenize`` answers)."""
    data = np.asarray(list(ids), dtype=np.int64)
    return InferenceRequest(
        inputs=[Tensor(TOKEN_IDS, (len(data),), "INT64", data)], parameters={"detokenize": True}
    )


@attrs.frozen(slots=True)
class TokenLogprob:
    """One token: its text, its log-probability under the model (before any temperature
    or top-k/top-p; None for a prompt's first token, which nothing predicts), and the
    ``top`` most likely tokens with theirs (most likely first)."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...] = ()


def logprobs_to_parameter(entries: Sequence[TokenLogprob]) -> str:
    """The value of :data:`LOGPROBS_PARAMETER` (JSON: every door carries a string)."""
    return json.dumps([[e.token, e.logprob, [list(t) for t in e.top]] for e in entries])


def logprobs_from_parameter(value: object) -> list[TokenLogprob]:
    """:func:`logprobs_to_parameter` read back; :class:`BadInput` for anything else."""
    try:
        plain = json.loads(value) if isinstance(value, str) else None
        entries = []
        for token, logprob, top in plain:  # type: ignore[union-attr]
            pairs = tuple((str(t), _logprob(lp)) for t, lp in top)
            entries.append(TokenLogprob(str(token), None if logprob is None else _logprob(logprob), pairs))
        return entries
    except (TypeError, ValueError):
        raise BadInput("response parameter 'logprobs': not a list of [token, logprob, top]") from None


def _logprob(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    # -inf (a token the model rules out) travels as JSON's -Infinity, which json reads
    return float(value) if not math.isnan(value) else float("-inf")
