"""The clients LLM users bring, against a real server serving a tiny Llama through the
``transformers`` runtime: the requests of ``vllm bench serve``, GuideLLM, AIPerf /
genai-perf and lm-eval's ``local-completions``, recorded from their sources (see each
payload), sent as they send them and read as they read the stream; vLLM's sampling
extensions at their neutral values; ``ignore_eos`` / ``min_tokens`` (exact token counts);
``logprobs`` against the model's own log-softmax; vLLM's ``/tokenize``,
``/detokenize``, ``/health`` and ``/version``; the runtime's declared inputs; usage on
``generate``; and stateful chat equal to the whole history sent without a sequence."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import trio
from support.tiny_llm import build

import actorserve
from actorserve.limits import MAX_CHAT_MESSAGES
from actorserve.modelsettings import model_settings_from_dict
from actorserve.server import serve
from actorserve.settings import Settings

pytest.importorskip("transformers")

TIMEOUT = 60.0
PROMPT = "To be, or not to be"
#: Llama 2's template: a BOS before the first turn only, each answer closed by ``</s>``
#: (written out: the tiny tokenizer's one special token is both its BOS and its EOS)
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
)
#: ChatML (Qwen's): every turn closed, the assistant's opened by the generation prompt
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("clients") / "llama", "llama", dtype="float32")


class Greedy:
    """The checkpoint's own greedy tokens and log-probabilities, one forward per token
    over the whole context (no cache: the plainest oracle)."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
        self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.eos = self.tok.eos_token_id

    def run(
        self, prompt: str, n: int, *, ignore_eos: bool = False, min_tokens: int = 0
    ) -> list[tuple[int, Any]]:
        """(token, log-softmax row) of each generated token, EOS included when it ends."""
        ids = self.tok(prompt)["input_ids"]
        out: list[tuple[int, Any]] = []
        with torch.inference_mode():
            for _ in range(n):
                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                raw = torch.log_softmax(logits, -1)
                if len(out) < min_tokens:
                    logits[self.eos] = float("-inf")
                token = int(logits.argmax())
                out.append((token, raw))
                if token == self.eos and not ignore_eos:
                    break
                ids.append(token)
        return out

    def text(self, prompt: str, tokens: list[int]) -> str:
        prompt_ids = self.tok(prompt)["input_ids"]
        decode = partial(self.tok.decode, skip_special_tokens=True)
        return str(decode(prompt_ids + tokens))[len(decode(prompt_ids)) :]


@pytest.fixture(scope="module")
def greedy(folder: Path) -> Greedy:
    return Greedy(folder)


@pytest.fixture
async def http(nursery: trio.Nursery, folder: Path) -> AsyncIterator[httpx.AsyncClient]:
    data = {"name": "llm", "implementation": "transformers", "parameters": {"dtype": "float32"}}
    settings = Settings(
        models=(model_settings_from_dict(data, folder=folder),), host="127.0.0.1", http_port=0, grpc_port=0
    )
    server = await nursery.start(partial(serve, settings))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        yield client


async def sse(client: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a stream, read as vLLM's ``StreamedResponseHandler`` reads them
    (``data:`` lines, ``[DONE]`` last)."""
    async with client.stream("POST", path, json=payload) as reply:
        assert reply.status_code == 200, await reply.aread()
        body = (await reply.aread()).decode()
    messages = [m.strip() for m in body.split("\n\n") if m.strip()]
    assert messages[-1] == "data: [DONE]"
    return [json.loads(m.removeprefix("data:").strip()) for m in messages[:-1]]


def text_of(chunks: list[dict[str, Any]], chat: bool) -> str:
    pieces = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            pieces.append((choice["delta"].get("content") if chat else choice.get("text")) or "")
    return "".join(pieces)


# -- the benchmark clients' recorded requests ---------------------------------------------------


async def test_vllm_bench_serve_completions_and_chat(http: httpx.AsyncClient, greedy: Greedy) -> None:
    """``vllm bench serve`` (vllm/benchmarks/lib/endpoint_request_func.py,
    ``async_request_openai_completions`` / ``..._chat_completions``): the random dataset
    adds ``ignore_eos``; ``--temperature 0 --top-k -1 --top-p 1 --min-p 0`` go in
    ``extra_body``. Every request makes exactly ``max_tokens`` tokens."""
    expected = [t for t, _ in greedy.run(PROMPT, 24, ignore_eos=True)]
    completion = {
        "model": "llm",
        "prompt": PROMPT,
        "repetition_penalty": 1.0,
        "max_tokens": 24,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": -1,
        "top_p": 1.0,
        "min_p": 0.0,
    }
    chunks = await sse(http, "/v1/completions", completion)
    assert text_of(chunks, chat=False) == greedy.text(PROMPT, expected)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"

    messages = [{"role": "user", "content": [{"type": "text", "text": "Who is there?"}]}]
    rendered = greedy.tok.apply_chat_template(
        [{"role": "user", "content": "Who is there?"}], tokenize=False, add_generation_prompt=True
    )
    expected = [t for t, _ in greedy.run(rendered, 20, ignore_eos=True)]
    chat = {
        "model": "llm",
        "messages": messages,
        "max_completion_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
    }
    chunks = await sse(http, "/v1/chat/completions", chat)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text_of(chunks, chat=True) == greedy.text(rendered, expected)
    assert chunks[-1]["usage"]["completion_tokens"] == 20


async def test_guidellm_completions_and_chat(http: httpx.AsyncClient, greedy: Greedy) -> None:
    """GuideLLM 0.8.1 (guidellm/backends/openai/request_handlers.py, the ``format`` of
    its completions and chat handlers): ``stop: null``, ``ignore_eos``, and
    ``continuous_usage_stats`` (every chunk carries the usage so far; it keeps the last)."""
    payload = {
        "model": "llm",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": 16,
        "stop": None,
        "ignore_eos": True,
        "prompt": PROMPT,
        "temperature": 0,
    }
    chunks = await sse(http, "/v1/completions", payload)
    assert all(c["usage"] is not None for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 16
    prompt_tokens = len(greedy.tok(PROMPT)["input_ids"])
    assert chunks[-1]["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 16,
        "total_tokens": prompt_tokens + 16,
    }
    expected = [t for t, _ in greedy.run(PROMPT, 16, ignore_eos=True)]
    assert text_of(chunks, chat=False) == greedy.text(PROMPT, expected)

    chat = {
        "model": "llm",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_completion_tokens": 12,
        "stop": None,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Speak."}]}],
    }
    chunks = await sse(http, "/v1/chat/completions", chat)
    assert chunks[-1]["usage"]["completion_tokens"] == 12


async def test_aiperf_genai_perf_chat_with_min_tokens(http: httpx.AsyncClient, greedy: Greedy) -> None:
    """AIPerf 0.13 (aiperf/endpoints/openai_chat.py and openai_completions.py,
    ``format_payload``) with the ``--extra-inputs`` a fixed output length is asked with
    (``min_tokens`` = ``max_tokens``, ``ignore_eos``), as genai-perf documents them."""
    payload = {
        "messages": [{"role": "user", "content": "Hark"}],
        "model": "llm",
        "stream": True,
        "max_completion_tokens": 10,
        "min_tokens": 10,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    chunks = await sse(http, "/v1/chat/completions", payload)
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    completion = {
        "prompt": PROMPT,
        "model": "llm",
        "stream": True,
        "max_tokens": 10,
        "min_tokens": 10,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    chunks = await sse(http, "/v1/completions", completion)
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    # min_tokens alone: EOS cannot come before it (greedy under the mask, as vLLM's)
    rendered = greedy.tok.apply_chat_template(
        [{"role": "user", "content": "Hark"}], tokenize=False, add_generation_prompt=True
    )
    want = greedy.run(rendered, 30, min_tokens=10)
    reply = await http.post(
        "/v1/chat/completions",
        json={
            "model": "llm",
            "messages": [{"role": "user", "content": "Hark"}],
            "max_tokens": 30,
            "min_tokens": 10,
            "temperature": 0,
        },
    )
    body = reply.json()
    assert body["choices"][0]["message"]["content"] == greedy.text(
        rendered, [t for t, _ in want if t != greedy.eos]
    )
    assert body["usage"]["completion_tokens"] == len(want) >= 10


async def test_lm_eval_local_completions(http: httpx.AsyncClient, greedy: Greedy) -> None:
    """lm-eval's ``local-completions`` (lm_eval/models/openai_completions.py,
    ``_create_payload``): ``generate_until`` sends a list of prompts with ``stop``,
    ``seed`` and ``temperature: 0``; ``loglikelihood`` sends ``echo: true`` with
    ``logprobs: 1`` and ``max_tokens: 1`` and reads ``token_logprobs`` / ``top_logprobs``
    of the prompt's tokens (the first has none)."""
    reply = await http.post(
        "/v1/completions",
        json={
            "model": "llm",
            "prompt": [PROMPT, "ROMEO:"],
            "max_tokens": 12,
            "temperature": 0,
            "stop": ["\n\n"],
            "seed": 1234,
        },
    )
    assert reply.status_code == 200 and len(reply.json()["choices"]) == 2
    loglikelihood = {
        "model": "llm",
        "prompt": PROMPT,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    reply = await http.post("/v1/completions", json=loglikelihood)
    choice = reply.json()["choices"][0]
    ids = greedy.tok(PROMPT)["input_ids"]
    with torch.inference_mode():
        raw = torch.log_softmax(greedy.model(torch.tensor([ids])).logits[0].float(), -1)
    ((token, last),) = greedy.run(PROMPT, 1, ignore_eos=True)
    decode = greedy.tok.decode
    logprobs = choice["logprobs"]
    assert choice["text"] == PROMPT + greedy.text(PROMPT, [token])
    assert logprobs["tokens"] == [decode([t]) for t in [*ids, token]]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    want = [float(raw[i, t]) for i, t in enumerate(ids[1:])] + [float(last[token])]
    assert logprobs["token_logprobs"][1:] == pytest.approx(want, abs=1e-4)
    # is_greedy: the likeliest alternative of each prompt token, as lm-eval reads it
    for i, top in enumerate(logprobs["top_logprobs"][1:-1]):
        best = int(raw[i].argmax())
        assert top[decode([best])] == pytest.approx(float(raw[i, best]), abs=1e-4)
    assert logprobs["text_offset"][0] == 0
    # echo in a sequence is refused
    reply = await http.post("/v1/completions", json={**loglikelihood, "sequence_start": True})
    assert reply.status_code == 400


async def test_neutral_extensions_pass_and_others_are_refused_by_name(http: httpx.AsyncClient) -> None:
    neutral = {
        "repetition_penalty": 1,
        "min_p": 0,
        "top_k": 0,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "length_penalty": 1,
        "use_beam_search": False,
        "best_of": 1,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "include_stop_str_in_output": False,
        "min_tokens": 0,
        "ignore_eos": False,
    }
    reply = await http.post(
        "/v1/completions", json={"model": "llm", "prompt": "a", "max_tokens": 2, **neutral}
    )
    assert reply.status_code == 200, reply.text
    for key, value in [
        ("repetition_penalty", 1.2),
        ("min_p", 0.1),
        ("use_beam_search", True),
        ("best_of", 2),
        ("skip_special_tokens", False),
        ("include_stop_str_in_output", True),
        ("presence_penalty", 0.5),
    ]:
        reply = await http.post("/v1/completions", json={"model": "llm", "prompt": "a", key: value})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == key, (key, reply.text)
    for key, value, path in [
        ("top_logprobs", 21, "/v1/chat/completions"),
        ("logprobs", 21, "/v1/completions"),
        ("min_tokens", 9, "/v1/completions"),  # more than max_tokens
        ("top_k", -2, "/v1/completions"),
        ("ignore_eos", "yes", "/v1/completions"),
    ]:
        body: dict[str, Any] = {"model": "llm", "max_tokens": 4, key: value}
        if path.endswith("chat/completions"):
            body.update(messages=[{"role": "user", "content": "a"}], logprobs=True)
        else:
            body["prompt"] = "a"
        reply = await http.post(path, json=body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == key, (key, reply.text)


# -- logprobs ---------------------------------------------------------------------------------


async def test_logprobs_on_completions_and_chat(http: httpx.AsyncClient, greedy: Greedy) -> None:
    want = greedy.run(PROMPT, 6, ignore_eos=True)
    reply = await http.post(
        "/v1/completions",
        json={
            "model": "llm",
            "prompt": PROMPT,
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": 3,
            "ignore_eos": True,
        },
    )
    logprobs = reply.json()["choices"][0]["logprobs"]
    decode = greedy.tok.decode
    assert logprobs["tokens"] == [decode([t]) for t, _ in want]
    assert logprobs["token_logprobs"] == pytest.approx([float(raw[t]) for t, raw in want], abs=1e-4)
    for top, (token, raw) in zip(logprobs["top_logprobs"], want, strict=True):
        # the token itself, then its 3 likeliest (two ids may decode to the same text:
        # the likelier one's entry stays, as a dict keyed by text keeps it)
        values, ids = raw.topk(3)
        expected = {decode([token]): float(raw[token])}
        for value, i in reversed(list(zip(values.tolist(), ids.tolist(), strict=True))):
            expected[decode([i])] = value
        assert top == pytest.approx(expected, abs=1e-4)
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and all(
        b - a == len(t) for a, b, t in zip(offsets, offsets[1:], logprobs["tokens"], strict=False)
    )

    chat = {
        "model": "llm",
        "messages": [{"role": "user", "content": "Hail"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = await sse(http, "/v1/chat/completions", chat)
    content = [
        e
        for c in chunks
        for choice in c["choices"]
        if choice["logprobs"]
        for e in choice["logprobs"]["content"]
    ]
    rendered = greedy.tok.apply_chat_template(
        [{"role": "user", "content": "Hail"}], tokenize=False, add_generation_prompt=True
    )
    want = greedy.run(rendered, 5, ignore_eos=True)
    assert [e["token"] for e in content] == [decode([t]) for t, _ in want]
    assert [e["logprob"] for e in content] == pytest.approx([float(raw[t]) for t, raw in want], abs=1e-4)
    assert all(len(e["top_logprobs"]) == 2 and e["bytes"] == list(e["token"].encode()) for e in content)


# -- vLLM's other routes ------------------------------------------------------------------------


async def test_tokenize_detokenize_health_and_version(http: httpx.AsyncClient, greedy: Greedy) -> None:
    reply = await http.post("/tokenize", json={"model": "llm", "prompt": PROMPT})
    ids = greedy.tok(PROMPT)["input_ids"]
    assert reply.json() == {"count": len(ids), "max_model_len": 256, "tokens": ids}
    reply = await http.post(
        "/tokenize", json={"prompt": PROMPT, "add_special_tokens": False, "return_token_strs": True}
    )
    plain = greedy.tok(PROMPT, add_special_tokens=False)["input_ids"]
    assert reply.json()["tokens"] == plain
    assert reply.json()["token_strs"] == greedy.tok.convert_ids_to_tokens(plain)
    messages = [{"role": "user", "content": "Hi"}]
    reply = await http.post("/tokenize", json={"model": "llm", "messages": messages})
    rendered = greedy.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert reply.json()["tokens"] == greedy.tok(rendered, add_special_tokens=False)["input_ids"]
    reply = await http.post("/detokenize", json={"model": "llm", "tokens": ids})
    assert reply.json() == {"prompt": greedy.tok.decode(ids)}
    for path, body, param in [
        ("/detokenize", {"tokens": [10**9]}, None),
        ("/detokenize", {"tokens": ["a"]}, "tokens"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"model": "text", "prompt": "a"}, "model"),  # not a tokenizing model
    ]:
        reply = await http.post(path, json=body)
        assert reply.status_code in (400, 404) and reply.json()["error"]["param"] == param, reply.text
    reply = await http.get("/health")
    assert reply.status_code == 200 and reply.content == b""
    reply = await http.get("/version")
    assert reply.json() == {"version": actorserve.__version__}


# -- honest answers: inputs, usage --------------------------------------------------------------


async def test_declared_inputs_and_an_unknown_input_is_refused(http: httpx.AsyncClient) -> None:
    meta = (await http.get("/v2/models/llm")).json()
    assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]
    assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]
    config = (await http.get("/v2/models/llm/config")).json()
    assert [t["name"] for t in config["input"]] == ["text_input"]
    assert [t["name"] for t in config["output"]] == ["text_output"]
    tensor = {"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["Hi"]}
    reply = await http.post("/v2/models/llm/infer", json={"inputs": [tensor]})
    assert reply.status_code == 400 and "no input 'prompt'" in reply.json()["error"]
    reply = await http.post("/v2/models/llm/generate", json={"prompt": "Hi"})
    assert reply.status_code == 400 and "no input 'prompt'" in reply.json()["error"]


async def test_usage_on_generate_and_generate_stream(http: httpx.AsyncClient, greedy: Greedy) -> None:
    body = {
        "text_input": PROMPT,
        "parameters": {"max_tokens": 8, "temperature": 0, "usage": True, "ignore_eos": True},
    }
    reply = (await http.post("/v2/models/llm/generate", json=body)).json()
    prompt_tokens = len(greedy.tok(PROMPT)["input_ids"])
    assert (reply["prompt_tokens"], reply["completion_tokens"], reply["finish_reason"]) == (
        prompt_tokens,
        8,
        "length",
    )
    reply = await http.post("/v2/models/llm/generate_stream", json=body)
    events = [json.loads(e.removeprefix("data: ")) for e in reply.text.split("\n\n") if e]
    assert [e["completion_tokens"] for e in events if "completion_tokens" in e][-1] == 8
    assert events[-1]["finish_reason"] == "length" and "finish_reason" not in events[0]
    plain = (
        await http.post("/v2/models/llm/generate", json={"text_input": "a", "parameters": {"max_tokens": 2}})
    ).json()
    assert "completion_tokens" not in plain and "finish_reason" not in plain  # not asked


# -- stateful chat ------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [LLAMA_TEMPLATE, CHATML_TEMPLATE], ids=["llama", "chatml"])
async def test_stateful_chat_reads_the_tokens_of_the_whole_history(
    nursery: trio.Nursery, folder: Path, tmp_path: Path, greedy: Greedy, template: str
) -> None:
    """Each turn of a sequence sends only its new message; the model reads exactly the
    tokens of the whole history rendered and sent without a sequence (one BOS, the
    previous answers closed), and answers the same."""
    checkpoint = tmp_path / "llm"
    shutil.copytree(folder, checkpoint)
    (checkpoint / "chat_template.jinja").write_text(template)  # as a checkpoint ships it
    data = {
        "name": "llm",
        "implementation": "transformers",
        "parameters": {"dtype": "float32"},
        "sequence": {"idle_timeout_ms": 60_000},
    }
    settings = Settings(
        models=(model_settings_from_dict(data, folder=checkpoint),),
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
    )
    server = await nursery.start(partial(serve, settings))
    model = server.engine.model("llm")  # type: ignore[attr-defined]
    fed: list[list[int]] = []  # the tokens each request's context holds, as begin made them
    begin = model.begin

    def recording(request: Any, state: Any) -> Any:
        work = begin(request, state)
        fed.append(list(work.feed))
        return work

    model.begin = recording
    history: list[dict[str, str]] = []
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        sequence: dict[str, Any] = {"sequence_start": True}
        for turn in ["Who is there?", "Nay, answer me.", "Long live the king!"]:
            history.append({"role": "user", "content": turn})
            body = {"model": "llm", "max_tokens": 8, "temperature": 0}
            stateless = await client.post("/v1/chat/completions", json={**body, "messages": history})
            stateful = await client.post(
                "/v1/chat/completions", json={**body, "messages": [history[-1]], **sequence}
            )
            assert stateful.status_code == 200, stateful.text
            # the tokens of the whole history, as transformers renders and tokenizes it
            rendered = greedy.tok.apply_chat_template(
                history, chat_template=template, tokenize=False, add_generation_prompt=True
            )
            assert fed[-1] == fed[-2] == greedy.tok(rendered)["input_ids"]
            answer = stateful.json()["choices"][0]["message"]["content"]
            assert answer == stateless.json()["choices"][0]["message"]["content"]
            # the tokens the sequence read: those of its whole history, rendered once
            assert stateful.json()["usage"]["prompt_tokens"] <= stateless.json()["usage"]["prompt_tokens"]
            sequence = {"sequence_id": stateful.json()["sequence_id"]}
            history.append({"role": "assistant", "content": answer})
        # a plain-text turn in a conversation is refused, not appended
        reply = await client.post("/v2/models/llm/generate", json={"text_input": "x", "parameters": sequence})
        assert reply.status_code == 400 and "conversation" in reply.json()["error"]
        # the messages parameter (what the door sends) is checked like any client value
        for messages, why in [
            ("not json", "expected a JSON list of messages"),
            ('[{"role": "user"}]', "each message is"),
            ('[{"role": "user", "content": 3}]', "each message is"),
            ("[]", "expected a JSON list of messages"),
            (json.dumps([{"role": "user", "content": "x"}] * (MAX_CHAT_MESSAGES + 1)), "MAX_CHAT_MESSAGES"),
        ]:
            body = {"parameters": {"messages": messages, "max_tokens": 1}}
            reply = await client.post("/v2/models/llm/generate", json=body)
            assert reply.status_code == 400 and why in reply.json()["error"], reply.text
        body = {"text_input": "x", "parameters": {"messages": '[{"role": "user", "content": "x"}]'}}
        reply = await client.post("/v2/models/llm/generate", json=body)
        assert reply.status_code == 400 and "a chat turn has no 'text_input'" in reply.json()["error"]
