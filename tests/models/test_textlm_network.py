"""Fast, synchronous tests of the character GRU and its generation core (no server)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from actorserve.models.textlm.network import (
    PACKAGE_DIR,
    VOCAB_FILE,
    WEIGHTS_FILE,
    CharGRU,
    CharVocab,
    TextLMCore,
    generate,
    load_textlm,
)

PROMPTS = [
    "ROMEO:\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "K",
    "What light through yonder window breaks? ",
    "\n",
    "To be, or not to be",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou",
]


@pytest.fixture(scope="module")
def core() -> Iterator[TextLMCore]:
    # One intra-op thread: this small GRU gains little from two, and on a busy 2-core
    # machine two threads are tens of times slower (they spin-wait for each other).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, vocab = load_textlm(device="cpu")
    yield TextLMCore(model, vocab, "cpu")
    torch.set_num_threads(threads)


def batch_generate(
    core: TextLMCore, prompts: list[str], max_tokens: int, temperature: float, top_k: int, seeds: list[int]
) -> list[str]:
    """All prompts as one continuously batched group: one prefill, then one decode per step."""
    gens = [TextLMCore.make_generator(s) for s in seeds]
    states, logits = core.prefill(
        [core.initial_state() for _ in prompts], [core.vocab.encode(p) for p in prompts]
    )
    stacked = torch.stack(states, dim=1)
    outs: list[list[int]] = [[] for _ in prompts]
    for step in range(max_tokens):
        rows = logits.cpu()
        tokens = [TextLMCore.sample(rows[i], temperature, top_k, gens[i]) for i in range(len(prompts))]
        for out, t in zip(outs, tokens, strict=True):
            out.append(t)
        if step + 1 < max_tokens:
            stacked, logits = core.decode(stacked, tokens)
    return [core.vocab.decode(o) for o in outs]


def test_committed_files_and_load(core: TextLMCore) -> None:
    assert (PACKAGE_DIR / WEIGHTS_FILE).stat().st_size <= 5_000_000
    meta = json.loads((PACKAGE_DIR / VOCAB_FILE).read_text(encoding="utf-8"))
    assert isinstance(core.model, CharGRU)
    assert not core.model.training
    assert core.vocab.size == len(meta["chars"]) == core.model.config.vocab_size
    assert core.model.config.hidden_size == meta["hidden_size"]
    assert core.model.config.num_layers == meta["num_layers"]
    assert core.model.config.embedding_size == meta["embedding_size"]
    assert all(p.dtype == torch.float32 for p in core.model.parameters())
    state = core.initial_state()
    assert state.shape == (meta["num_layers"], meta["hidden_size"])
    assert not state.any()


def test_vocab_round_trip(core: TextLMCore) -> None:
    vocab = core.vocab
    text = "".join(PROMPTS)
    assert vocab.decode(vocab.encode(text)) == text
    assert vocab.decode(vocab.encode(vocab.chars)) == vocab.chars
    assert vocab.encode(vocab.chars) == list(range(vocab.size))
    # Unknown characters map to the fallback.
    assert vocab.decode(vocab.encode("é~\t")) == vocab.fallback * 3
    assert vocab.encode_array(text).tolist() == vocab.encode(text)
    with pytest.raises(ValueError):
        CharVocab("aa")
    with pytest.raises(ValueError):
        CharVocab("ab", fallback="c")


def test_prefill_batched_equals_alone(core: TextLMCore) -> None:
    chunks = [core.vocab.encode(p) for p in PROMPTS] + [[]]  # an empty chunk is a no-op
    start = [core.initial_state() for _ in chunks]
    # Non-zero initial states too: continue from a first prefill.
    start[0] = core.prefill([core.initial_state()], [core.vocab.encode("Hark! ")])[0][0]
    states, logits = core.prefill(start, chunks)
    assert logits.shape == (len(chunks), core.vocab.size)
    for i, chunk in enumerate(chunks):
        alone_states, alone_logits = core.prefill([start[i]], [chunk])
        torch.testing.assert_close(states[i], alone_states[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[i], alone_logits[0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(states[-1], start[-1])
    # Prefill of a whole chunk equals the full forward pass (and the logits match its last position).
    ids = chunks[1]
    with torch.inference_mode():
        full_logits, full_h = core.model(torch.tensor([ids]))
    torch.testing.assert_close(states[1], full_h[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1], full_logits[0, -1], atol=1e-4, rtol=1e-5)


def test_prefill_in_pieces_equals_whole(core: TextLMCore) -> None:
    ids = core.vocab.encode(PROMPTS[6])
    whole_states, whole_logits = core.prefill([core.initial_state()], [ids])
    state = core.initial_state()
    for piece in (ids[:5], ids[5:6], ids[6:40], ids[40:]):
        states, logits = core.prefill([state], [piece])
        state = states[0]
    torch.testing.assert_close(state, whole_states[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, whole_logits, atol=1e-4, rtol=1e-5)


def test_decode_batched_equals_alone(core: TextLMCore) -> None:
    states, _ = core.prefill([core.initial_state() for _ in PROMPTS], [core.vocab.encode(p) for p in PROMPTS])
    tokens = core.vocab.encode("abcdefgh")
    new_list, logits_list = core.decode(states, tokens)
    new_stacked, logits_stacked = core.decode(torch.stack(states, dim=1), tokens)
    assert isinstance(new_list, list) and len(new_list) == len(PROMPTS)
    assert new_stacked.shape == (core.num_layers, len(PROMPTS), core.hidden_size)
    torch.testing.assert_close(logits_list, logits_stacked)
    for i in range(len(PROMPTS)):
        alone, alone_logits = core.decode([states[i]], [tokens[i]])
        torch.testing.assert_close(new_list[i], alone[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(new_stacked[:, i], alone[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits_list[i], alone_logits[0], atol=1e-4, rtol=1e-5)
    # One decode step equals a one-character prefill.
    pre, pre_logits = core.prefill(states, [[t] for t in tokens])
    for i in range(len(PROMPTS)):
        torch.testing.assert_close(pre[i], new_list[i], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pre_logits, logits_list, atol=1e-4, rtol=1e-5)


def test_sample(core: TextLMCore) -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    gen = TextLMCore.make_generator(0)
    assert TextLMCore.sample(logits, 0.0, 0, gen) == 1
    assert TextLMCore.sample(logits, 0.0, 2, gen) == 1
    draws = {TextLMCore.sample(logits, 1.0, 2, gen) for _ in range(200)}
    assert draws == {1, 3}
    draws = {TextLMCore.sample(logits, 5.0, 0, gen) for _ in range(500)}
    assert draws == {0, 1, 2, 3, 4}
    a = [TextLMCore.sample(logits, 1.0, 0, TextLMCore.make_generator(7)) for _ in range(3)]
    assert len(set(a)) == 1  # same seed, same first draw
    g1, g2 = TextLMCore.make_generator(7), TextLMCore.make_generator(7)
    s1 = [TextLMCore.sample(logits, 1.0, 0, g1) for _ in range(50)]
    s2 = [TextLMCore.sample(logits, 1.0, 0, g2) for _ in range(50)]
    assert s1 == s2


@pytest.mark.parametrize(("temperature", "top_k"), [(0.0, 0), (0.8, 0), (1.0, 10)])
def test_generation_alone_equals_in_batch_of_32(core: TextLMCore, temperature: float, top_k: int) -> None:
    n_tokens = 100
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(32)]
    seeds = [1000 + i for i in range(32)]
    batched = batch_generate(core, prompts, n_tokens, temperature, top_k, seeds)
    for i in (0, 1, 2, 5, 13, 31):
        alone = generate(core, prompts[i], n_tokens, temperature=temperature, top_k=top_k, seed=seeds[i])
        assert batched[i] == alone, (i, batched[i], alone)
        assert len(alone) == n_tokens
        assert alone.strip()
        assert set(alone) <= set(core.vocab.chars)
    if temperature == 0.0:
        assert batched[0] == batched[8]  # greedy ignores the seed
    else:
        assert batched[0] != batched[8]  # same prompt, different seeds


def test_generate_text(core: TextLMCore) -> None:
    text = generate(core, "ROMEO:\n", 200, temperature=0.8, seed=3)
    assert len(text) == 200
    assert text.strip()
    assert set(text) <= set(core.vocab.chars)
    assert generate(core, "ROMEO:\n", 200, temperature=0.8, seed=3) == text
    assert generate(core, "", 20, temperature=0.0) != ""
    assert generate(core, "ROMEO:\n", 0) == ""
    # A trained model: greedy text is mostly letters and spaces, not noise.
    greedy = generate(core, "KING RICHARD III:\n", 200, temperature=0.0)
    assert sum(c.isalpha() or c.isspace() for c in greedy) / len(greedy) > 0.85
