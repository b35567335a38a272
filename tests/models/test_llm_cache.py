"""The KV cache of the ``transformers`` runtime across requests: the prefix cache (a
resent conversation reads only its new tokens, and answers token for token as without
reuse and as ``transformers``' own greedy ``generate``), and the budget's fairness when
sequences are bound to tokens (a request drops only its own owner's idle caches, else
429), with each request reserving at most up to the end of the context."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import trio
from support.tiny_llm import build

import actorserve
from actorserve import InferenceRequest, InferenceResponse, Overloaded
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.engine.gauges import watch_engine
from actorserve.models.llm import TransformersModel
from actorserve.models.llm.forward import kv_bytes
from actorserve.models.llm.prefix import BLOCK
from actorserve.modelsettings import model_settings_from_dict
from actorserve.server import serve
from actorserve.settings import Settings

pytest.importorskip("transformers")

TIMEOUT = 60.0
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GREEDY = {"temperature": 0}
#: ten user turns of a chat (the answers are the model's)
TURNS = [
    "Who is there?",
    "Nay, answer me: stand, and unfold yourself.",
    "Long live the king!",
    "You come most carefully upon your hour.",
    "Tis now struck twelve; get thee to bed, Francisco.",
    "For this relief much thanks: tis bitter cold, and I am sick at heart.",
    "Have you had quiet guard?",
    "Not a mouse stirring.",
    "Well, good night.",
    "If you do meet Horatio and Marcellus, bid them make haste.",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llmcache")
    return {
        "gpt2": build(root / "gpt2", "gpt2", dtype="float32"),
        "llama": build(root / "llama", "llama", dtype="float32", context=1024),
    }


def request(prompt: str, **parameters: Any) -> InferenceRequest:
    data = np.empty(1, dtype=object)
    data[0] = prompt.encode()
    return InferenceRequest([tensor_from_numpy("text_input", data, "BYTES")], parameters=parameters)


@asynccontextmanager
async def llm_engine(folder: Path, **parameters: Any) -> AsyncIterator[tuple[Engine, TransformersModel]]:
    data = {
        "name": "llm",
        "implementation": "transformers",
        "parameters": {"dtype": "float32", **parameters},
        "sequence": {"idle_timeout_ms": 60_000, "max_sequences": 64},
    }
    with trio.fail_after(TIMEOUT):
        async with actorserve.open_engine([model_settings_from_dict(data, folder=folder)]) as engine:
            model = engine.model("llm")
            assert isinstance(model, TransformersModel)
            yield engine, model


async def text(engine: Engine, prompt: str, **parameters: Any) -> str:
    response = await engine.infer(request(prompt, **parameters), model="llm")
    return str(response.outputs[0].data[0].decode())


async def at_once(engine: Engine, prompts: list[str]) -> list[str]:
    """Greedy answers of ``prompts`` sent together."""
    got: dict[int, str] = {}

    async def one(i: int) -> None:
        got[i] = await text(engine, prompts[i], max_tokens=8, **GREEDY)

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return [got[i] for i in range(len(prompts))]


@functools.cache
def checkpoint(folder: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    return tok, model.to(DEVICE).eval()


def generate(folder: Path, prompt: str, max_tokens: int) -> str:
    """``transformers``' own greedy answer (fp32), as the text the runtime streams."""
    tok, model = checkpoint(folder)
    ids = tok(prompt, return_tensors="pt").input_ids.to(DEVICE)
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
    new = out[0, ids.shape[1] :].tolist()
    if new and new[-1] == tok.eos_token_id:
        new = new[:-1]
    prompt_ids = ids[0].tolist()
    decode = tok.decode
    return str(decode(prompt_ids + new, skip_special_tokens=True))[
        len(decode(prompt_ids, skip_special_tokens=True)) :
    ]


async def chat(
    engine: Engine, model: TransformersModel, max_tokens: int
) -> tuple[list[str], list[int], list[int]]:
    """The ten turns resent whole, as an OpenAI chat client sends them: each turn's answer,
    the tokens each turn's prompt has, and the tokens each turn's prefill read."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are Barnardo, on guard."}]
    answers: list[str] = []
    lengths: list[int] = []
    read: list[int] = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        rendered = model.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        before = model.cache_statistics().prefilled_tokens
        answer = await text(engine, rendered, max_tokens=max_tokens, **GREEDY)
        read.append(model.cache_statistics().prefilled_tokens - before)
        lengths.append(len(model.tokenizer(rendered)["input_ids"]))
        answers.append(answer)
        messages.append({"role": "assistant", "content": answer})
    return answers, lengths, read


async def test_a_resent_ten_turn_chat_reads_only_its_new_tokens(folders: dict[str, Path]) -> None:
    async with llm_engine(folders["llama"], prefix_cache=False) as (engine, model):
        without, lengths, read = await chat(engine, model, 12)
        assert read == lengths  # every turn reads its whole conversation
        assert model.cache_statistics().reused_tokens == 0
    async with llm_engine(folders["llama"]) as (engine, model):
        answers, lengths_again, read = await chat(engine, model, 12)
        stats = model.cache_statistics()
    assert answers == without and lengths_again == lengths
    assert any(len(a) > 5 for a in answers)
    assert read[0] == lengths[0]
    for turn in range(1, len(TURNS)):
        # the previous turn's conversation is in the prefix cache, but for its last
        # partial block: this turn reads its new tokens (the last answer and the new
        # question) and at most one block more
        new = lengths[turn] - lengths[turn - 1]
        assert read[turn] < new + BLOCK, (turn, read, lengths)
    assert sum(read) < sum(lengths) // 2
    assert stats.reused_tokens == sum(lengths) - sum(read)
    assert stats.prefix_blocks > 0 and stats.prefix_bytes == stats.prefix_blocks * BLOCK * model.token_bytes
    assert stats.reserved_bytes == 0  # every request released its reservation
    # the tenth turn answers as transformers' own greedy generate over the whole chat
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are Barnardo, on guard."}]
    for turn, answer in zip(TURNS, answers, strict=True):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    last = model.tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert answers[-1] == generate(folders["llama"], last, 12)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
async def test_prefix_reuse_answers_as_without_it(arch: str, folders: dict[str, Path]) -> None:
    """Requests sharing prefixes of every length around block boundaries, alone and
    several at once, answer token for token as without reuse and as ``generate``."""
    base = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 2
    prompts = [base[:n] for n in (40, 63, 64, 65, 90, len(base))] + [base + "And all the clouds"]
    got: dict[bool, list[str]] = {}
    for reuse in (False, True):
        async with llm_engine(folders[arch], prefix_cache=reuse, prefill_chunk=8) as (engine, model):
            alone = [await text(engine, p, max_tokens=8, **GREEDY) for p in prompts]
            assert await at_once(engine, prompts) == alone
            got[reuse] = alone
            assert (model.cache_statistics().reused_tokens > 0) == reuse
    assert got[True] == got[False]
    assert got[True] == [generate(folders[arch], p, 8) for p in prompts]


async def test_a_sequence_starts_from_the_prefix_cache(folders: dict[str, Path]) -> None:
    """A new sequence (or one whose cache the budget dropped) whose text starts with a
    cached prefix reads only the rest, and answers as without reuse."""
    system = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 2
    async with llm_engine(folders["gpt2"]) as (engine, model):
        expected = await text(engine, system + "All:\nSpeak, speak.", max_tokens=6, **GREEDY)
        before = model.cache_statistics()
        got = await text(
            engine,
            system + "All:\nSpeak, speak.",
            sequence_id="s",
            sequence_start=True,
            max_tokens=6,
            **GREEDY,
        )
        after = model.cache_statistics()
        assert got == expected
        assert after.reused_tokens - before.reused_tokens >= BLOCK
        assert after.prefilled_tokens - before.prefilled_tokens < len(model.tokenizer(system)["input_ids"])


async def test_a_request_reserves_up_to_the_end_of_the_context_only(folders: dict[str, Path]) -> None:
    """max_tokens 4096 on a 256-token context reserves at most the context: an idle
    sequence's cache that fits beside it stays (it was dropped when the request
    reserved its prompt + 4096 tokens)."""
    # gpt2 here: 1 KiB per token, context 256; the budget fits 300 tokens
    async with llm_engine(folders["gpt2"], kv_cache_budget_mb=300 / 1024) as (engine, model):
        await text(engine, "ROMEO:\nI", sequence_id="a", sequence_start=True, max_tokens=4, **GREEDY)
        assert model.sequences["a"].kv is not None
        await text(engine, "JULIET:\nAy", sequence_id="b", sequence_start=True, max_tokens=4096, **GREEDY)
        assert model.sequences["a"].kv is not None
        assert model.cache_statistics().dropped_caches == 0


async def test_bound_sequences_drop_only_their_own_idle_caches_else_429(folders: dict[str, Path]) -> None:
    """With sequences bound to tokens (the requests' owners), one client's requests never
    drop another client's idle cache: they drop their own owner's, least recently used
    first, then are refused with Overloaded (429, Retry-After) while the other's cache
    is in the way."""
    # gpt2 here: 1 KiB per token; the budget fits 40 tokens. The model knows a bound
    # sequence as "<id>@<owner>" (the owner's first 12 characters)
    async with llm_engine(folders["gpt2"], kv_cache_budget_mb=40 / 1024) as (engine, model):

        async def say(owner: str, sequence: str, prompt: str, max_tokens: int, **control: Any) -> str:
            return await text(
                engine,
                prompt,
                sequence_id=sequence,
                sequence_owner=owner,
                max_tokens=max_tokens,
                **control,
                **GREEDY,
            )

        await say("alice", "a1", "ROMEO:\nI", 4, sequence_start=True)
        held = model.sequences["a1@alice"].kv
        assert held is not None
        alice = held[0][0].shape[-2]
        await say("bob", "b1", "JULIET:\nAy", 4, sequence_start=True)
        assert model.sequences["b1@bob"].kv is not None
        # room for b2 drops bob's own b1 (though alice's a1 was used less recently)
        room = 40 - alice - model.sequences["b1@bob"].kv[0][0].shape[-2]  # type: ignore[index]
        await say("bob", "b2", "K", room + 2, sequence_start=True)
        assert model.sequences["b1@bob"].kv is None and model.sequences["a1@alice"].kv is held
        # b3 cannot fit beside alice's cache even with none of bob's left: 429
        with pytest.raises(Overloaded, match="kv_cache_budget_mb") as refused:
            await say("bob", "b3", "K", 40 - alice + 2, sequence_start=True)
        assert refused.value.retry_after == 1 and refused.value.bound == "kv_cache_budget_mb"
        assert model.sequences["a1@alice"].kv is held and model.sequences["b2@bob"].kv is None
        stats = model.cache_statistics()
        assert stats.refused == 1 and stats.dropped_caches == 2 and stats.reserved_bytes == 0
        # alice's sequence kept its cache: it reads only what is new (and ends)
        history = model.sequences["a1@alice"].text
        before = model.cache_statistics().prefilled_tokens
        await say("alice", "a1", " me", 2, sequence_end=True)
        assert model.cache_statistics().prefilled_tokens - before < len(model.tokenizer(history)["input_ids"])
        # bob's sequences stay open and go on, reading their text again, and answer as
        # the whole text sent alone
        history = model.sequences["b1@bob"].text
        more = await say("bob", "b1", " me", 2)
        assert more == await text(engine, history + " me", sequence_owner="bob", max_tokens=2, **GREEDY)


async def test_two_owners_sequences_of_one_name_keep_their_own_text_and_cache(
    folders: dict[str, Path],
) -> None:
    """Issue 30, finding 9: bound to tokens, two owners may each open a sequence "s";
    the runtime gets two ids (the model's, unique per owner), so their texts and KV
    caches stay apart, and each goes on from its own text."""
    async with llm_engine(folders["gpt2"]) as (engine, model):

        async def say(owner: str, prompt: str, **control: Any) -> InferenceResponse:
            return await engine.infer(
                request(prompt, sequence_id="s", sequence_owner=owner, max_tokens=3, **control, **GREEDY),
                model="llm",
            )

        opened = [
            await say("a" * 32, "ROMEO:\nI", sequence_start=True),
            await say("b" * 32, "JULIET:\nAy", sequence_start=True),
        ]
        alice, bob = model.sequences[f"s@{'a' * 12}"], model.sequences[f"s@{'b' * 12}"]
        assert sorted(model.sequences) == [f"s@{'a' * 12}", f"s@{'b' * 12}"]
        assert alice.text.startswith("ROMEO:\nI") and bob.text.startswith("JULIET:\nAy")
        assert alice.kv is not None and bob.kv is not None and alice.kv is not bob.kv
        histories = [alice.text, bob.text]
        more = [await say("a" * 32, " me"), await say("b" * 32, " me")]
        alone = [await text(engine, history + " me", max_tokens=3, **GREEDY) for history in histories]
    assert [r.parameters["sequence_id"] for r in opened + more] == ["s"] * 4
    assert [str(r.outputs[0].data[0].decode()) for r in more] == alone


async def test_over_rest_a_bound_client_gets_429_with_retry_after(
    nursery: trio.Nursery, folders: dict[str, Path], tmp_path: Path
) -> None:
    """``--bind-sequences-to-token`` on a real server: bob's request that would need
    alice's idle cache gets 429 with ``Retry-After``; alice's sequence keeps its cache."""
    tokens = ("token-of-alice-0123456789", "token-of-bob-9876543210")
    (tmp_path / "tokens").write_text("\n".join(tokens) + "\n")
    data = {
        "name": "llm",
        "implementation": "transformers",
        "parameters": {"dtype": "float32", "kv_cache_budget_mb": 40 / 1024},  # 40 tokens
    }
    settings = Settings(
        models=(model_settings_from_dict(data, folder=folders["gpt2"]),),
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        no_auth=False,
        auth_inference=True,
        bind_sequences_to_token=True,
        token_file=str(tmp_path / "tokens"),
    )
    server = await nursery.start(partial(serve, settings))
    alice, bob = ({"Authorization": f"Bearer {token}"} for token in tokens)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:

        async def generate(headers: dict[str, str], prompt: str, **parameters: Any) -> httpx.Response:
            body = {"text_input": prompt, "parameters": {**GREEDY, **parameters}}
            return await client.post("/v2/models/llm/generate", json=body, headers=headers)

        opened = await generate(alice, "ROMEO:\nI", max_tokens=4, sequence_start=True)
        assert opened.status_code == 200, opened.text
        sid = opened.headers["sequence-id"]
        refused = await generate(bob, "K", max_tokens=38, sequence_start=True)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
        assert "kv_cache_budget_mb" in refused.json()["error"]
        again = await generate(alice, " me", max_tokens=2, sequence_id=sid)
        assert again.status_code == 200, again.text
        # a request of bob's that fits beside alice's cache runs
        assert (await generate(bob, "K", max_tokens=4)).status_code == 200


async def test_a_cancelled_request_releases_its_reservation_and_leaves_its_blocks(
    folders: dict[str, Path],
) -> None:
    prompt = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 2
    async with llm_engine(folders["gpt2"]) as (engine, model):
        async with engine.infer_stream(request(prompt, max_tokens=200, **GREEDY), model="llm") as responses:
            await responses.__anext__()
            assert model.cache_statistics().reserved_bytes > 0
        for _ in range(200):  # the request leaves the batch at its next step
            if model.cache_statistics().reserved_bytes == 0:
                break
            await trio.sleep(0.01)
        stats = model.cache_statistics()
        assert (
            stats.reserved_bytes == 0
            and stats.prefix_blocks >= len(model.tokenizer(prompt)["input_ids"]) // BLOCK
        )
        assert await text(engine, prompt, max_tokens=6, **GREEDY) == generate(folders["gpt2"], prompt, 6)
        assert model.cache_statistics().reused_tokens > 0


async def test_kv_cache_usage_is_the_bytes_held_over_the_budget(folders: dict[str, Path]) -> None:
    """The gauge the Inference Extension's endpoint picker reads: an idle sequence's
    cache over ``kv_cache_budget_mb`` (the prefix cache off, so that is all it holds),
    exported per model version and as the server's fullest."""
    budget = 300 * 1024
    async with llm_engine(folders["gpt2"], kv_cache_budget_mb=300 / 1024, prefix_cache=False) as (
        engine,
        model,
    ):
        watch_engine(engine)
        assert model.kv_cache_usage() == 0.0
        await text(engine, "ROMEO:\nI", sequence_id="a", sequence_start=True, max_tokens=4, **GREEDY)
        held = kv_bytes(model.sequences["a"].kv)
        assert 0 < held < budget
        assert model.kv_cache_usage() == held / budget
        engine.metrics.refresh()
        exposed = engine.metrics.expose().decode().splitlines()
        assert f'actorserve_model_kv_cache_usage_ratio{{model="llm",version="1"}} {held / budget}' in exposed
        assert f"actorserve_kv_cache_usage_ratio {held / budget}" in exposed
