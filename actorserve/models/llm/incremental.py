"""A sequence's context tokenized one turn at a time: each turn tokenizes only what is
new (from a little before the end of the text the last turn tokenized), and the ids are
exactly those of tokenizing the whole text.

Why it can be exact: a fast tokenizer splits its text on added (special) tokens first,
then into pre-tokens (words), and encodes each word on its own; BPE merges never cross a
word. Text appended to a text can change only its last words (a trailing space that
becomes the next word's leading space, a word that goes on, a digit group, an added
token that grows), so the tokens of every word before those are the tokens of the longer
text too. So a turn whose context starts with the text the last turn tokenized backs up
:data:`WORDS_BACK` words from its end, tokenizes the text from there (no special tokens
added) and splices: ``old_ids[:k] + new_ids``.

What is checked, since a tokenizer may break that locality where a text begins (a
``Metaspace`` that prepends its ``▁`` to the first word only, a ``ByteLevel`` that adds a
prefix space, offsets trimmed of their spaces): the new tokens must repeat the old tokens
of the first word they cover, at the same characters, and end that word where it ended.
Where they do not, the splice is tried once more from the special token before that word
(the text after a special token is tokenized apart from what precedes it: a chat
template's turn markers), and else the turn tokenizes the whole text. A tokenizer whose post-processor adds tokens
after the text, or a slow (Python) tokenizer (no offsets, no words), always tokenizes the
whole text; so does a context that does not start with the last one (a chat template
that renders an earlier turn differently) and a turn with fewer words than that to back
over. :func:`incremental_holds` runs a few texts both ways at load and turns splicing
off for a tokenizer that does not give the same ids.
"""

from __future__ import annotations

from array import array
from typing import Any

import attrs

#: words backed over from the end of the old text: the last two may change, and the one
#: before them is tokenized again as the check that the splice joins up
WORDS_BACK = 3
#: how far back a special token to splice at is looked for (words)
MAX_WORDS_BACK = 64


@attrs.frozen(eq=False)
class Tokenized:
    """A text and its tokens as tokenizing the whole text gives them: ``ids``, each
    token's first character (``starts``) and its word (``words``: -1 for a token the
    tokenizer adds, as a BOS). Never changed once made (the runtime's ``feed`` is a
    list of its own); int32 arrays, 12 bytes a token."""

    text: str
    ids: array[int]
    starts: array[int]
    words: array[int]


def encode(tokenizer: Any, text: str, *, special: bool = True) -> Tokenized:
    """``text`` tokenized whole as ``tokenizer(text)`` tokenizes it, with its offsets
    and words (a fast tokenizer)."""
    encoding = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    words = encoding.word_ids()
    return Tokenized(
        text,
        array("i", encoding["input_ids"]),
        array("i", [start for start, _ in encoding["offset_mapping"]]),
        array("i", [-1 if w is None else w for w in words]),
    )


class Tokenizing:
    """One model's tokenizing of contexts: :meth:`whole` (a request alone, a sequence's
    first turn, a tokenizer that cannot splice) or :meth:`extend` (a sequence's turn after
    one it tokenized). ``splice``: whether :meth:`extend` may splice (a fast tokenizer
    that passed :func:`incremental_holds`)."""

    def __init__(self, tokenizer: Any, *, splice: bool) -> None:
        self.tokenizer = tokenizer
        self.splice = splice and bool(getattr(tokenizer, "is_fast", False))
        #: the ids of its added (special) tokens: a text is split at them first
        self.added = frozenset(getattr(tokenizer, "added_tokens_decoder", None) or ())

    def whole(self, text: str, *, offsets: bool = True) -> Tokenized:
        """``text`` tokenized whole; with ``offsets`` (when splicing is on) what a later
        :meth:`extend` needs to splice onto it."""
        if not (offsets and self.splice):
            ids = array("i", self.tokenizer(text)["input_ids"])
            return Tokenized(text, ids, array("i"), array("i"))
        return encode(self.tokenizer, text)

    def extend(self, before: Tokenized | None, text: str) -> Tokenized:
        """``text`` tokenized exactly as :meth:`whole` would, tokenizing only its end
        when it starts with ``before.text`` (the sequence's last tokenized context)."""
        if self.splice and before is not None and before.starts and text.startswith(before.text):
            spliced = self._splice(before, text)
            if spliced is not None:
                return spliced
        return self.whole(text)

    def _splice(self, before: Tokenized, text: str) -> Tokenized | None:
        words = before.words
        firsts: list[int] = []  # the first token of each of the last words, last first
        i = len(words) - 1
        while i >= 0 and len(firsts) < MAX_WORDS_BACK and words[i] >= 0:  # -1: an added BOS / EOS
            while i > 0 and words[i - 1] == words[i]:
                i -= 1
            firsts.append(i)
            i -= 1
        if len(firsts) < WORDS_BACK:
            return None
        # the third word back; where that does not join up (a Metaspace's ▁ before the
        # first word of a text), the special token before it: the text after a special
        # token is tokenized apart from what precedes it
        tries = [WORDS_BACK - 1]
        tries += [n for n in range(WORDS_BACK, len(firsts)) if before.ids[firsts[n]] in self.added][:1]
        for n in tries:
            spliced = self._splice_at(before, text, firsts[n], firsts[n - 1])
            if spliced is not None:
                return spliced
        return None

    def _splice_at(self, before: Tokenized, text: str, k: int, joint: int) -> Tokenized | None:
        """``text`` tokenized from the first character of token ``k`` (the first of its
        word; ``joint``: the first of the next), where its tokens up to ``joint`` are
        those it had, at the same characters. The old text's last words are tokenized
        from there first (a few characters): where a text that starts there tokenizes
        otherwise, the new text is never handed over."""
        at = before.starts[k]
        probe = encode(self.tokenizer, before.text[at:], special=False)
        if probe.ids != before.ids[k:] or any(
            s + at != old for s, old in zip(probe.starts, before.starts[k:], strict=True)
        ):
            return None
        tail = encode(self.tokenizer, text[at:], special=False)
        again = joint - k
        if (
            len(tail.ids) <= again
            or min(tail.words) < 0
            or tail.ids[:again] != before.ids[k:joint]
            or any(tail.starts[j] + at != before.starts[k + j] for j in range(again + 1))
        ):
            return None
        base = before.words[k]
        return Tokenized(
            text,
            before.ids[:k] + tail.ids,
            before.starts[:k] + array("i", [s + at for s in tail.starts]),
            before.words[:k] + array("i", [w + base for w in tail.words]),
        )


#: (old text, appended text) pairs :func:`incremental_holds` tries at load; ``{s}`` is a
#: special token of the tokenizer
PROBES = (
    ("Hello, world!  It's 12345 caf", "é's 678   and\n\n  more  日本語 "),
    ("{s}user: hi there{s}assistant:", " Sure  thing.\n{s}user: and 99?{s}assistant:"),
    ("a  b\t\tc", "  d'll e"),
    ("x{s}", "{s}{s} y"),
)


def incremental_holds(tokenizing: Tokenizing) -> bool:
    """Whether splicing gives the ids of the whole text on a few texts (at load: a
    tokenizer that breaks the locality in a way the check misses tokenizes whole)."""
    if not tokenizing.splice:
        return False
    tokenizer = tokenizing.tokenizer
    special = str(getattr(tokenizer, "eos_token", None) or getattr(tokenizer, "bos_token", None) or "")
    holds = True
    for old, new in PROBES:
        old, new = old.format(s=special), new.format(s=special)
        before = tokenizing.whole(old)
        for cut in range(len(new) + 1):
            text = old + new[:cut]
            holds = holds and tokenizing.extend(before, text).ids == tokenizing.whole(text).ids
        holds = holds and tokenizing.extend(before, old + new).ids == array(
            "i", tokenizer(old + new)["input_ids"]
        )
    return holds
