"""The prompt of a request of the ``transformers`` runtime, bounded before it is
tokenized and tokenized off the event loop.

A tokenizer takes time and memory in proportion to its text (30 MB of text, 58 KB of
gzip on the wire, held every model of the engine for 81 s when it was tokenized in
``begin``). So the text is measured first: no token is longer than the longest entry of
the vocabulary, so a text of more than ``max_context`` times that many characters cannot
fit the context and is refused untokenized (``max_prompt_chars``). The tokenizer then
runs in a worker thread (:meth:`Prompts.prepare`, awaited by the engine before
``begin``), and ``begin`` takes the ids it made.
"""

from __future__ import annotations

import weakref
from typing import Any

import trio

from ...errors import BadInput
from ...types import InferenceRequest, Tensor
from .torchserve import TS_BODY, from_torchserve

#: (the request as the runtime reads it, its whole text with the history, its token ids)
Read = tuple[InferenceRequest, str, list[int]]

#: a normalizer may shorten a text before it is split into tokens (NFKC composes
#: characters, some strip accents): the character bound allows for this factor
NORMALIZED_SHRINK = 2


def longest_token(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its vocabulary's
    longest entry (byte-level and SentencePiece entries are at least as long as the text
    they decode to)."""
    return max((len(entry) for entry in tokenizer.get_vocab()), default=1)


def prompt_of(request: InferenceRequest, model: str, known: frozenset[str]) -> tuple[InferenceRequest, str]:
    """The request as the runtime reads it (a TorchServe body turned into ``text_input``
    and parameters) and its prompt text; :class:`BadInput` for anything else."""
    tensor = request.input("text_input", required=False)
    body = request.input(TS_BODY, required=False) if tensor is None else None
    if body is not None:
        request, tensor = from_torchserve(request, body, model, known)
    if tensor is None:
        return request, ""
    return request, _text(tensor)


def _text(tensor: Tensor) -> str:
    if tensor.datatype != "BYTES" or tensor.data.size != 1:
        raise BadInput(
            f"input 'text_input': expected BYTES with shape [1], got {tensor.datatype} {list(tensor.shape)}"
        )
    value = tensor.data.reshape(-1)[0]
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class Prompts:
    """Reads and tokenizes prompts for one model: :meth:`prepare` (awaited before
    ``begin``) does it in a worker thread, :meth:`take` (in ``begin``) returns what it
    made, or does it then when nothing was prepared (a model used without the engine)."""

    def __init__(self, model: str, known: frozenset[str]) -> None:
        self.model = model
        self.known = known
        self.tokenizer: Any = None
        self.start_token = 0
        #: the longest text (with a sequence's history) that may fit the context
        self.max_chars = 0
        #: id(request) -> (a weak reference to it, the history it was read with, what
        #: :meth:`take` returns); an entry goes with its request (requests compare by value,
        #: so they cannot be keys of a WeakKeyDictionary)
        self._prepared: dict[int, tuple[weakref.ref[InferenceRequest], str, Read]] = {}

    def set_tokenizer(self, tokenizer: Any, start_token: int, max_context: int, max_chars: int) -> None:
        """After loading: ``max_chars`` 0 means ``max_context`` times the longest token."""
        self.tokenizer = tokenizer
        self.start_token = start_token
        self.max_chars = max_chars or max_context * longest_token(tokenizer) * NORMALIZED_SHRINK

    async def prepare(self, request: InferenceRequest, history: str) -> None:
        read = await trio.to_thread.run_sync(self._read, request, history)
        key = id(request)
        self._prepared[key] = (weakref.ref(request, lambda _: self._prepared.pop(key, None)), history, read)

    def take(self, request: InferenceRequest, history: str) -> Read:
        """(the request as read, its whole text, that text's token ids)."""
        prepared = self._prepared.pop(id(request), None)
        if prepared is not None and prepared[0]() is request and prepared[1] == history:
            return prepared[2]
        return self._read(request, history)

    def _read(self, request: InferenceRequest, history: str) -> Read:
        request, prompt = prompt_of(request, self.model, self.known)
        text = history + prompt
        if len(text) > self.max_chars:
            raise BadInput(
                f"input 'text_input': {len(text)} characters (with the sequence's history), more than "
                f"{self.max_chars} (max_prompt_chars: no longer text fits the model's context)"
            )
        ids = [int(i) for i in self.tokenizer(text)["input_ids"]] or [self.start_token]
        return request, text, ids
