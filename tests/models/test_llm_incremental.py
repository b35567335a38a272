"""Issue 30, finding 2: a sequence's turn tokenizes only what is new. The ids of a turn
spliced onto the last turn's are exactly the ids of tokenizing the whole text, for
random conversations (whitespace runs, punctuation, partial words, unicode, special
tokens as text) on tokenizers trained on tests/data text (byte-level BPE as GPT-2's, with
added chat tokens and a BOS, a Metaspace one as Llama 2's, and two that cannot splice),
with no template, a Llama-style and a ChatML-style one; and a long conversation's turn
hands the tokenizer about its new text, not the whole (characters counted, never time)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_llm import llm_engine, text

from actorserve.chattemplate import render_messages
from actorserve.models.llm.incremental import Tokenizing, incremental_holds

pytest.importorskip("transformers")

#: Llama 2's chat template (its BOS written as text), and ChatML (Qwen's)
LLAMA = (
    "<|endoftext|>{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}</s>{% endif %}{% endfor %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {"plain": "", "llama": LLAMA, "chatml": CHATML}
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "</s>"]

#: pieces of text a conversation is drawn from: words and partial words, contractions and
#: digit runs (which pre-tokenizers split on), whitespace runs, unicode (a combining
#: accent, CJK, an emoji), special tokens and pieces of them as text
PIECES = [
    *"the th e ROMEO ing 's 'll ' 123 4567 0 , . !? ... - é 日本 語 🙂 Ω <| |> [ ]".split(),
    *(" ", "  ", "   ", "\n", "\n\n", "\t", " \n ", "e\u0301"),
    *("<|endoftext|>", *CHAT_TOKENS),
]
texts = st.lists(st.sampled_from(PIECES) | st.text(alphabet="ab ,.'\n\t1é日", max_size=5), max_size=10).map(
    "".join
)
conversations = st.lists(st.tuples(texts, texts), min_size=1, max_size=6)


def _wrapped(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def _byte_level(base: Any, change: str) -> Any:
    """A copy of the tests' byte-level BPE tokenizer (tests/support/tiny_llm.py) changed
    as named."""
    from tokenizers import Tokenizer, pre_tokenizers, processors

    tok = Tokenizer.from_str(base.backend_tokenizer.to_str())
    bos = tok.token_to_id("<|endoftext|>")
    if change == "chat tokens and a BOS":  # as Qwen's and Llama 3's: markers are added tokens
        tok.add_special_tokens(CHAT_TOKENS)
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
        )
    elif change == "prefix space":  # a space added before the text: splices where the check holds
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    elif change == "eos after":  # a post-processor that adds after the text: never splices
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", bos)]
        )
    return _wrapped(tok)


def _sentencepiece_like(legacy: bool) -> Any:
    """A BPE trained on the same text with ``▁`` for spaces, as Llama 2's converted
    tokenizers: a Metaspace that prepends ``▁`` to the first word only, or (``legacy``)
    no pre-tokenizer at all (BPE over each text between special tokens, ``▁`` prepended
    to each by the normalizer); both with a BOS and the chat markers as added tokens."""
    from support.tiny_llm import training_text
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|endoftext|>", *CHAT_TOKENS])
    text = training_text()
    tok.train_from_iterator([text[i : i + 4096] for i in range(0, len(text), 4096)], trainer)
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))]
    )
    return _wrapped(tok)


VARIANTS = ["byte-level", "chat tokens and a BOS", "metaspace", "llama2 legacy", "prefix space", "eos after"]


class Counting:
    """A tokenizer that counts the characters it is handed."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.chars = 0

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.chars += len(text)
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


@pytest.fixture(scope="module")
def tokenizings() -> dict[str, Tokenizing]:
    """Each variant's tokenizing as the runtime sets it up at load."""
    from support.tiny_llm import tokenizer

    base = tokenizer()
    made = {}
    for name in VARIANTS:
        if name in ("metaspace", "llama2 legacy"):
            made_tokenizer = _sentencepiece_like(legacy=name == "llama2 legacy")
        else:
            made_tokenizer = base if name == "byte-level" else _byte_level(base, name)
        tokenizing = Tokenizing(made_tokenizer, splice=True)
        tokenizing.splice = incremental_holds(tokenizing)
        made[name] = tokenizing
    return made


def _contexts(template: str, turns: list[tuple[str, str]]) -> list[str]:
    """Each turn's whole context as the runtime makes it: the text so far (with the
    answers) and the prompt, or the conversation rendered whole."""
    contexts: list[str] = []
    said, messages = "", []
    for prompt, answer in turns:
        if template:
            messages.append({"role": "user", "content": prompt})
            contexts.append(render_messages(template, messages))
            messages.append({"role": "assistant", "content": answer})
        else:
            contexts.append(said + prompt)
        said = contexts[-1] + answer
    return contexts


def test_every_tokenizer_passes_the_load_probes_and_a_slow_one_never_splices(
    tokenizings: dict[str, Tokenizing],
) -> None:
    assert all(tokenizing.splice for tokenizing in tokenizings.values())
    slow = Counting(tokenizings["byte-level"].tokenizer)
    slow.is_fast = False  # no offsets, no words: every turn tokenizes its whole context
    tokenizing = Tokenizing(slow, splice=True)
    assert not tokenizing.splice and not incremental_holds(tokenizing)
    before = tokenizing.extend(None, "ROMEO: I am here, my lord. ")
    whole = slow(before.text + "Ay")["input_ids"]
    slow.chars = 0
    assert tokenizing.extend(before, before.text + "Ay").ids.tolist() == whole
    assert slow.chars == len(before.text + "Ay")


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=100, deadline=None)
@given(turns=conversations)
def test_spliced_ids_are_the_whole_texts(
    tokenizings: dict[str, Tokenizing], variant: str, template: str, turns: list[tuple[str, str]]
) -> None:
    # splicing on without the load probes: the checks of each turn alone keep it exact
    tokenizing = Tokenizing(tokenizings[variant].tokenizer, splice=True)
    before = None
    for context in _contexts(TEMPLATES[template], turns):
        tokens = tokenizing.extend(before, context)
        assert tokens.ids.tolist() == tokenizing.tokenizer(context)["input_ids"], context
        before = tokens


#: what a turn may tokenize beyond what it adds: the last words of the text before it,
#: twice (tokenized alone first, as a check), and once more for a special token before them
TAIL = 100
#: the tokenizers and templates whose turns tokenize their whole context (exactly): no
#: special token to splice at and a start of text tokenized apart (▁ or a space prepended),
#: or an EOS added after the text
WHOLE = {("llama2 legacy", "plain"), ("prefix space", "chatml")} | {("eos after", t) for t in TEMPLATES}


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_long_conversations_turn_tokenizes_only_its_new_text(
    tokenizings: dict[str, Tokenizing], variant: str, template: str
) -> None:
    tokenizer = tokenizings[variant].tokenizer
    counting = Counting(tokenizer)
    spliced = Tokenizing(counting, splice=True)
    turns = [(f"Now, {i} lords: what say'st thou?  ", f" Ay, my lord {i * 7}.\n") for i in range(60)]
    contexts = _contexts(TEMPLATES[template], turns)
    before = spliced.extend(None, contexts[0])
    for previous, context in itertools.pairwise(contexts):
        counting.chars = 0
        before = spliced.extend(before, context)
        assert before.ids.tolist() == tokenizer(context)["input_ids"]
        if (variant, template) in WHOLE:
            assert counting.chars >= len(context)
        else:
            assert counting.chars <= len(context) - len(previous) + TAIL
    assert len(contexts[-1]) > 60 * 40  # the whole text is long; a turn adds ~60 characters


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from support.tiny_llm import build

    return build(tmp_path_factory.mktemp("llm") / "gpt2", "gpt2", dtype="float32", context=2048)


async def test_through_the_runtime_a_turn_tokenizes_only_its_new_text_and_answers_as_the_whole(
    folder: Path,
) -> None:
    greedy = {"temperature": 0, "max_tokens": 3}
    async with llm_engine(folder) as (engine, model):
        assert model.prompts.tokenizing.splice
        counting = Counting(model.prompts.tokenizing.tokenizer)
        model.prompts.tokenizing.tokenizer = counting
        history, answer = "", ""
        parameters: dict[str, Any] = {"sequence_start": True}
        for i in range(16):
            prompt = f"\nFirst Citizen {i}:\nBefore we proceed any further, hear me speak.\n"
            counting.chars = 0
            previous, answer = answer, await text(engine, prompt, sequence_id="s", **parameters, **greedy)
            if i:  # the first turn is all new; a later one adds the last answer and its prompt
                assert counting.chars <= len(previous) + len(prompt) + TAIL
            history += prompt + answer
            parameters = {}
        assert len(history) > 16 * 60
        # the same answer as the whole text sent without a sequence
        last = history[: len(history) - len(answer)]
        assert await text(engine, last, **greedy) == answer
