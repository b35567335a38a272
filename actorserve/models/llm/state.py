"""What the ``transformers`` runtime keeps per sequence and per request, and its
incremental detokenizer (no model calls here; :mod:`.runtime` is the model)."""

from __future__ import annotations

from typing import Any

import torch

from ...types import InferenceRequest
from ..textlm.generation import Draws
from .forward import KV, Batch, owned


class LLMState:
    """One sequence: ``text`` (everything said so far: prompts and the answers sent),
    ``ids`` (the tokens whose keys and values are in ``kv``). ``busy`` while a request of
    the sequence is in the batch; ``evicted`` once the cache budget dropped it."""

    __slots__ = ("busy", "evicted", "ids", "kv", "sequence_id", "text")

    def __init__(self, sequence_id: str | None = None) -> None:
        self.sequence_id = sequence_id
        self.text = ""
        self.ids: list[int] = []
        self.kv: KV | None = None
        self.busy = False
        self.evicted = False


class Detokenizer:
    """Incremental text of generated tokens: each piece it returns is final, so the
    concatenation is ``decode(prompt + generated)`` after ``decode(prompt)``. A window of
    a few tokens before the new ones is decoded again (tokenizers that drop or merge a
    leading space decode a token differently alone), and a piece ending in U+FFFD (half a
    UTF-8 character) waits for the next token."""

    __slots__ = ("ids", "prefix", "read", "tokenizer")

    def __init__(self, tokenizer: Any, prompt: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt)
        self.prefix = max(0, len(prompt) - 5)  # the window starts here
        self.read = len(prompt)  # tokens before this are sent

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def add(self, token: int) -> str:
        self.ids.append(token)
        return self._take(final=False)

    def flush(self) -> str:
        return self._take(final=True)

    def _take(self, final: bool) -> str:
        if self.read == len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]


class LLMWork:
    """One request: ``feed`` (the tokens of its whole context) of which ``cached`` are in
    its cache (:meth:`cache`: ``kv``, or its row of the batch ``slot`` once it decodes);
    then the tokens it generates."""

    __slots__ = (
        "cached",
        "detok",
        "draws",
        "feed",
        "finished",
        "generated",
        "generator",
        "held",
        "kv",
        "max_tokens",
        "prompt_tokens",
        "request",
        "sent",
        "slot",
        "state",
        "stop",
        "temperature",
        "text",
        "top_k",
        "top_p",
    )

    def __init__(
        self,
        request: InferenceRequest,
        state: LLMState,
        text: str,
        feed: list[int],
        cached: int,
        *,
        tokenizer: Any,
        max_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
        stop: tuple[str, ...],
    ) -> None:
        self.request = request
        self.state = state
        self.text = text  # the context as text (the sequence's history and this prompt)
        self.feed = feed
        self.cached = cached
        self.kv = state.kv if cached else None
        self.slot: Batch[LLMWork] | None = None
        self.prompt_tokens = len(feed) - cached
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.stop = stop
        self.generator = torch.Generator().manual_seed(seed)
        self.detok = Detokenizer(tokenizer, feed)
        self.finished = False
        self.generated = 0
        self.held = ""  # generated text that may be the start of a stop string
        self.sent = ""  # the text sent so far
        self.draws = Draws(self.generator)

    def next_draw(self) -> float:
        """The next uniform of this request's generator (drawn in blocks, as the ``text``
        model draws them: :class:`~actorserve.models.textlm.generation.Draws`)."""
        return self.draws.next(self.max_tokens - self.generated)

    def has_cache(self) -> bool:
        return self.slot is not None or self.kv is not None

    def cache(self) -> KV:
        """This request's cache (a view of its batch's while it decodes)."""
        if self.slot is not None:
            return self.slot.row(self.slot.index[id(self)])
        return self.kv or []

    def settle(self) -> None:
        """Leave the sequence with what this request read and said (once)."""
        if self.finished:
            return
        self.finished = True
        state = self.state
        state.busy = False
        state.text = self.text + self.sent
        state.ids = self.feed[: self.cached]
        state.kv = owned(self.cache() or None)
        self.slot = self.kv = None
