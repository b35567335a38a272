"""What the ``transformers`` runtime keeps per sequence and per request, and its
incremental detokenizer (no model calls here; :mod:`.runtime` is the model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...texttokens import TokenLogprob
from ...types import InferenceRequest, InferenceResponse
from ..textlm.generation import Draws
from .forward import KV, Batch, owned
from .incremental import Tokenized


class LLMState:
    """One sequence: ``text`` (everything said so far: prompts and the answers sent),
    ``ids`` (the tokens whose keys and values are in ``kv``; both empty once the cache
    budget dropped its cache: its next request reads ``text`` again); ``messages``: the
    conversation so far when its turns come as chat messages (None: plain text);
    ``tokens``: the context its last turn read, tokenized (its next turn tokenizes only
    what it adds, :mod:`.incremental`; kept when the budget drops the cache). ``busy``
    while a request of the sequence is in the batch; ``owner``: the token fingerprint of
    its requests when sequences are bound to tokens (the cache budget's fairness)."""

    __slots__ = ("busy", "ids", "kv", "messages", "owner", "sequence_id", "text", "tokens")

    def __init__(self, sequence_id: str | None = None, owner: str | None = None) -> None:
        self.sequence_id = sequence_id
        self.owner = owner
        self.text = ""
        self.ids: list[int] = []
        self.kv: KV | None = None
        self.busy = False
        self.messages: list[dict[str, str]] | None = None
        self.tokens: Tokenized | None = None


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
    then the tokens it generates. ``prefix``: blocks of the prefix cache holding its first
    ``cached`` tokens, joined into ``kv`` by the step (off the event loop); ``settled``:
    the runtime's hook, told once when the request leaves (its cache still readable)."""

    __slots__ = (
        "__weakref__",  # the runtime's reservations forget a request dropped unsettled
        "answer",
        "cached",
        "detok",
        "draws",
        "echo",
        "feed",
        "finished",
        "generated",
        "generator",
        "held",
        "ignore_eos",
        "kv",
        "logprobs",
        "max_tokens",
        "messages",
        "min_tokens",
        "pending_logprobs",
        "prefix",
        "prompt_tokens",
        "request",
        "sent",
        "settled",
        "slot",
        "state",
        "stop",
        "temperature",
        "text",
        "top_k",
        "top_p",
        "usage",
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
        min_tokens: int = 0,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        usage: bool = False,
        messages: list[dict[str, str]] | None = None,
        prefix: list[Any] | None = None,
        settled: Callable[[LLMWork], None] | None = None,
    ) -> None:
        self.request = request
        self.state = state
        self.text = text  # the context as text (the sequence's history and this prompt)
        self.feed = feed
        self.cached = cached
        self.kv = state.kv if cached and not prefix else None
        self.prefix = prefix or None
        self.settled = settled
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
        self.min_tokens = min_tokens  # EOS cannot be drawn (and stop strings wait) until then
        self.ignore_eos = ignore_eos  # EOS is a token like any other
        self.logprobs = logprobs  # alternatives per token (None: no logprobs)
        self.pending_logprobs: list[TokenLogprob] = []  # for the next response
        self.usage = usage  # every response carries the token counts so far
        self.messages = messages  # the conversation this turn answers (chat history)
        self.answer: InferenceResponse | None = None  # a tokenizer request's whole answer
        self.echo: list[int] | None = None  # prompt tokens whose log-probabilities are still to send

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
        if self.messages is not None:
            state.messages = [*self.messages, {"role": "assistant", "content": self.sent}]
        kv = self.cache() or None if self.prefix is None else None
        cached = self.cached if self.prefix is None else 0
        state.ids = self.feed[:cached]
        if state.sequence_id is not None:  # a request alone keeps nothing of its own
            state.kv = owned(kv)
        if self.settled is not None:
            self.settled(self)
        self.slot = self.kv = None
        self.prefix = None


def raw_logprobs(logits: torch.Tensor, rows: list[LLMWork]) -> tuple[list[int], torch.Tensor] | None:
    """The rows that asked for ``logprobs`` and their log-softmax, taken before
    temperature, top-k/p and ``min_tokens`` change anything (vLLM's raw log-probabilities)."""
    wanted = [j for j, w in enumerate(rows) if w.logprobs is not None]
    if not wanted:
        return None
    return wanted, torch.log_softmax(logits[wanted].float(), dim=-1)


def without_eos(logits: torch.Tensor, rows: list[LLMWork], eos: frozenset[int]) -> torch.Tensor:
    """``logits`` where the rows short of their ``min_tokens`` cannot draw an EOS."""
    masked = [j for j, w in enumerate(rows) if w.generated < w.min_tokens]
    if not masked or not eos:
        return logits
    logits = logits.clone()
    ids = torch.tensor(sorted(eos), device=logits.device)
    logits[torch.tensor(masked, device=logits.device).unsqueeze(1), ids] = float("-inf")
    return logits


def token_logprobs(
    tokenizer: Any,
    eos: frozenset[int],
    rows: list[LLMWork],
    tokens: list[int],
    raw: tuple[list[int], torch.Tensor],
) -> None:
    """Each row of ``raw`` (:func:`raw_logprobs`): its token with its log-probability
    and its ``logprobs`` likeliest alternatives, kept for its next response; one transfer
    back for the batch. The EOS that ends a text is no token of it."""
    wanted, logprobs = raw
    chosen_ids = [tokens[j] for j in wanted]
    index = torch.tensor(chosen_ids, device=logprobs.device).unsqueeze(1)
    chosen = logprobs.gather(1, index).squeeze(1).tolist()
    most = max(rows[j].logprobs or 0 for j in wanted)
    values: list[list[float]] = [[] for _ in wanted]
    ids: list[list[int]] = [[] for _ in wanted]
    if most:
        top = logprobs.topk(most, dim=-1)
        values, ids = top.values.tolist(), top.indices.tolist()
    for n, j in enumerate(wanted):
        work, token = rows[j], tokens[j]
        if token in eos and not work.ignore_eos and work.generated + 1 >= work.min_tokens:
            continue
        k = work.logprobs or 0
        alternatives = tuple(
            (str(tokenizer.decode([t])), v) for t, v in zip(ids[n][:k], values[n][:k], strict=True)
        )
        work.pending_logprobs.append(TokenLogprob(str(tokenizer.decode([token])), chosen[n], alternatives))
