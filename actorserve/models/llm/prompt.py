"""The prompt of a request of the ``transformers`` runtime, bounded before it is
tokenized and tokenized off the event loop.

A tokenizer takes time and memory in proportion to its text (30 MB of text, 58 KB of
gzip on the wire, held every model of the engine for 81 s when it was tokenized in
``begin``). So the text is measured first: no token is longer than the longest entry of
the vocabulary, so a text of more than ``max_context`` times that many characters cannot
fit the context and is refused untokenized (``max_prompt_chars``). The tokenizer then
runs in a worker thread (:meth:`Prompts.prepare`, awaited by the engine before
``begin``), and ``begin`` takes the ids it made. A sequence's turn tokenizes only its new
text (:mod:`.incremental`: the ids are exactly those of the whole text), so a turn costs
the tokenizer what the turn adds, not what the conversation holds.
"""

from __future__ import annotations

import weakref
from typing import Any

import attrs
import trio

from ...api import bool_parameter
from ...errors import BadInput
from ...types import InferenceRequest
from .incremental import Tokenized, Tokenizing, incremental_holds
from .requests import context_text, request_prompt
from .state import LLMState

#: a normalizer may shorten a text before it is split into tokens (NFKC composes
#: characters, some strip accents): the character bound allows for this factor
NORMALIZED_SHRINK = 2


@attrs.frozen
class Read:
    """A request as the runtime reads it: the request (a TorchServe body turned into
    ``text_input`` and parameters), its own ``prompt``, and for a generation its whole
    context (``text``, with a sequence's history; ``messages``, the conversation of a chat
    turn) and that text's token ``ids`` (``tokens``: the same with what the sequence's next
    turn needs to tokenize only its new text). ``tokenizer_call``: a ``tokenize`` /
    ``detokenize`` request (no context, no ids)."""

    request: InferenceRequest
    prompt: str
    text: str
    messages: list[dict[str, str]] | None
    ids: list[int]
    tokens: Tokenized | None = None
    tokenizer_call: bool = False


def longest_token(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its vocabulary's
    longest entry (byte-level and SentencePiece entries are at least as long as the text
    they decode to)."""
    return max((len(entry) for entry in tokenizer.get_vocab()), default=1)


class Prompts:
    """Reads and tokenizes prompts for one model: :meth:`prepare` (awaited before
    ``begin``) does it in a worker thread, :meth:`take` (in ``begin``) returns what it
    made, or does it then when nothing was prepared (a model used without the engine, or
    a sequence whose history changed in between)."""

    def __init__(self, model: str, known: frozenset[str]) -> None:
        self.model = model
        self.known = known
        self.tokenizing = Tokenizing(None, splice=False)
        self.start_token = 0
        self.chat_template = ""
        #: the longest text (with a sequence's history) that may fit the context
        self.max_chars = 0
        #: id(request) -> (a weak reference to it, the history it was read with, what
        #: :meth:`take` returns); an entry goes with its request (requests compare by value,
        #: so they cannot be keys of a WeakKeyDictionary)
        self._prepared: dict[int, tuple[weakref.ref[InferenceRequest], tuple[str, object], Read]] = {}

    def set_tokenizer(
        self, tokenizer: Any, start_token: int, max_context: int, max_chars: int, chat_template: str
    ) -> None:
        """After loading: ``max_chars`` 0 means ``max_context`` times the longest token.
        Splicing a sequence's tokens is on where the tokenizer passes the probes of
        :func:`~.incremental.incremental_holds`."""
        self.tokenizing = Tokenizing(tokenizer, splice=True)
        self.tokenizing.splice = incremental_holds(self.tokenizing)
        self.start_token = start_token
        self.chat_template = chat_template
        self.max_chars = max_chars or max_context * longest_token(tokenizer) * NORMALIZED_SHRINK

    async def prepare(self, request: InferenceRequest, state: LLMState | None) -> None:
        read = await trio.to_thread.run_sync(self._read, request, state)
        key = id(request)
        forget = weakref.ref(request, lambda _: self._prepared.pop(key, None))
        self._prepared[key] = (forget, _history(state), read)

    def take(self, request: InferenceRequest, state: LLMState | None) -> Read:
        prepared = self._prepared.pop(id(request), None)
        if prepared is not None and prepared[0]() is request and prepared[1] == _history(state):
            return prepared[2]
        return self._read(request, state)

    def _read(self, request: InferenceRequest, state: LLMState | None) -> Read:
        request, prompt = request_prompt(request, self.model, self.known)
        params = request.parameters
        if any(bool_parameter(params[k], k) for k in ("tokenize", "detokenize") if k in params):
            self._bound(prompt, "")  # tokenized in begin: bounded all the same
            return Read(request, prompt, "", None, [], tokenizer_call=True)
        context = state if state is not None else LLMState()
        text, messages = context_text(params, prompt, context, self.model, self.chat_template)
        self._bound(text, " (with the sequence's history)")
        if state is None:
            tokens = self.tokenizing.whole(text, offsets=False)
        else:  # only what is new since the sequence's last turn, when it extends that one
            tokens = self.tokenizing.extend(state.tokens, text)
        ids = tokens.ids.tolist() or [self.start_token]
        return Read(request, prompt, text, messages, ids, tokens if state is not None else None)

    def _bound(self, text: str, what: str) -> None:
        if len(text) > self.max_chars:
            raise BadInput(
                f"input 'text_input': {len(text)} characters{what}, more than {self.max_chars} "
                "(max_prompt_chars: no longer text fits the model's context)"
            )


def _history(state: LLMState | None) -> tuple[str, object]:
    """What a prepared read depends on in its sequence: its text and its conversation
    (a new list at every turn, compared by identity)."""
    return ("", None) if state is None else (state.text, id(state.messages) if state.messages else None)
