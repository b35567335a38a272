"""The OpenAI API with the official ``openai`` client (sync in a thread, and async under
trio) against a real server on port 0: every route, every parameter, usage in the
model's own tokens, and the OpenAI error shape."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from e2e.openai_fixtures import ai_server, async_client, in_thread, sync_client

from actorserve.models import TEXT_CHAT_TEMPLATE
from actorserve.server.composition import Server

__all__ = ["ai_server", "async_client", "sync_client"]  # fixtures


def render(messages: list[dict[str, str]]) -> str:
    """The text model's chat template, by hand: each turn ``ROLE:\\ncontent\\n\\n``."""
    assert "upper" in TEXT_CHAT_TEMPLATE
    return "".join(f"{m['role'].upper()}:\n{m['content']}\n\n" for m in messages) + "ASSISTANT:\n"


async def test_models_lists_the_text_generators(sync_client: openai.OpenAI) -> None:
    listed = await in_thread(sync_client.models.list)
    assert sorted(m.id for m in listed.data) == ["streamer", "text"]  # identity does not generate text
    assert all(m.object == "model" and m.owned_by == "actorserve" for m in listed.data)
    one = await in_thread(lambda: sync_client.models.retrieve("text"))
    assert one.id == "text"
    with pytest.raises(openai.NotFoundError) as caught:
        await in_thread(lambda: sync_client.models.retrieve("identity"))
    assert caught.value.body == {
        "message": "The model 'identity' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


async def test_completion_seeds_reproduce_and_usage_counts_characters(sync_client: openai.OpenAI) -> None:
    def create(**kwargs: Any) -> Any:
        return sync_client.completions.create(model="text", prompt="ROMEO:", max_tokens=24, **kwargs)

    first = await in_thread(lambda: create(seed=7, n=3, temperature=1.0, user="tester"))
    again = await in_thread(lambda: create(seed=7, n=3, temperature=1.0))
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len({c.text for c in first.choices}) == 3  # choice j is seeded seed + j
    assert all(len(c.text) == 24 and c.finish_reason == "length" for c in first.choices)
    assert first.object == "text_completion" and first.model == "text" and first.id.startswith("cmpl-")
    usage = first.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (6, 72, 78)
    single = await in_thread(lambda: create(seed=8, temperature=1.0))
    assert single.choices[0].text == first.choices[1].text  # choice 1 of seed 7 is seed 8
    greedy = await in_thread(lambda: create(temperature=0))
    assert (await in_thread(lambda: create(temperature=0))).choices[0].text == greedy.choices[0].text
    # top_p: 0 keeps only the likeliest character, so any temperature gives the greedy text
    nucleus = await in_thread(lambda: create(temperature=1.5, top_p=0, seed=5))
    assert nucleus.choices[0].text == greedy.choices[0].text
    wide = await in_thread(lambda: create(temperature=1.0, top_p=0.9, seed=7, n=3))
    assert [c.text for c in wide.choices] != [c.text for c in first.choices]  # the nucleus changed the draws


async def test_a_list_of_prompts_gets_n_choices_each(sync_client: openai.OpenAI) -> None:
    prompts = ["ROMEO:", "JULIET:\nO"]
    reply = await in_thread(
        lambda: sync_client.completions.create(model="text", prompt=prompts, n=2, max_tokens=5, seed=3)
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(prompts):
        alone = await in_thread(
            lambda prompt=prompt: sync_client.completions.create(
                model="text", prompt=prompt, max_tokens=5, seed=3
            )
        )
        assert reply.choices[2 * p].text == alone.choices[0].text
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (6 + 9, 20)


async def test_stop_strings_end_the_text_before_them(sync_client: openai.OpenAI) -> None:
    def create(**kwargs: Any) -> Any:
        return sync_client.completions.create(model="text", prompt="ROMEO:", max_tokens=60, seed=11, **kwargs)

    full = (await in_thread(create)).choices[0].text
    stop = full[20:23]
    at = full.find(stop)
    stopped = await in_thread(lambda: create(stop=[stop, "@@never"]))
    assert stopped.choices[0].text == full[:at]
    assert stopped.choices[0].finish_reason == "stop"
    # streamer does not apply stop strings itself: the contract does, on the way out
    pieces = await in_thread(
        lambda: sync_client.completions.create(model="streamer", prompt="a", max_tokens=5, stop=":3")
    )
    assert (pieces.choices[0].text, pieces.choices[0].finish_reason) == ("a:0a:1a:2a", "stop")
    whole = await in_thread(
        lambda: sync_client.completions.create(model="streamer", prompt="a", max_tokens=2)
    )
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == ("a:0a:1", "length")
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (1, 2)


async def test_streamed_completion_matches_the_unary_one(async_client: openai.AsyncOpenAI) -> None:
    unary = await async_client.completions.create(model="text", prompt="KING:", max_tokens=30, seed=5, n=2)
    stream = await async_client.completions.create(
        model="text",
        prompt="KING:",
        max_tokens=30,
        seed=5,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = ["", ""]
    finishes: dict[int, str] = {}
    usage = None
    async for chunk in stream:
        assert chunk.object == "text_completion" and chunk.id.startswith("cmpl-")
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            assert choice.index not in finishes
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == [c.text for c in unary.choices]
    assert finishes == {0: "length", 1: "length"}
    assert usage is not None and unary.usage is not None
    assert usage.model_dump() == unary.usage.model_dump()


async def test_stream_without_include_usage_has_no_usage(ai_server: Server) -> None:
    assert ai_server.http_url is not None
    body = {"model": "streamer", "prompt": "x", "max_tokens": 2, "stream": True}
    async with httpx.AsyncClient(base_url=ai_server.http_url) as client:
        reply = await client.post("/v1/completions", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream"
    events = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [httpx.Response(200, content=e).json() for e in events[:-1]]
    # the text arrives in one or more chunks (tokens made together leave together), then
    # the finish reason on a chunk of its own
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == "x:0x:1" and texts[-1] == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert all("usage" not in c for c in chunks)


async def test_chat_unary_and_streamed(sync_client: openai.OpenAI, async_client: openai.AsyncOpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who art thou?"},
    ]
    reply = await in_thread(
        lambda: sync_client.chat.completions.create(
            model="text", messages=messages, max_completion_tokens=120, seed=2, temperature=0.5
        )
    )
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert "\n\n" not in (choice.message.content or "")  # a turn ends at a blank line (chat_stop)
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(render(messages))
    if choice.finish_reason == "length":
        assert reply.usage.completion_tokens == 120
    stream = await async_client.chat.completions.create(
        model="text", messages=messages, max_tokens=120, seed=2, temperature=0.5, stream=True
    )
    deltas = [chunk.choices[0] async for chunk in stream]
    assert deltas[0].delta.role == "assistant" and deltas[0].delta.content == ""
    assert "".join(d.delta.content or "" for d in deltas) == choice.message.content
    assert [d.finish_reason for d in deltas[-1:]] == [choice.finish_reason]
    assert all(d.finish_reason is None for d in deltas[:-1])


async def test_chat_content_parts_and_roles(sync_client: openai.OpenAI) -> None:
    parts: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Good "}, {"type": "text", "text": "morrow"}]}
    ]
    plain: list[Any] = [{"role": "user", "content": "Good morrow"}]

    def chat(messages: list[Any]) -> Any:
        return sync_client.chat.completions.create(
            model="text", messages=messages, max_tokens=10, temperature=0
        )

    assert (await in_thread(lambda: chat(parts))).choices[0].message.content == (
        await in_thread(lambda: chat(plain))
    ).choices[0].message.content
    with pytest.raises(openai.BadRequestError) as caught:
        await in_thread(lambda: chat([{"role": "tool", "content": "x", "tool_call_id": "1"}]))
    assert caught.value.body["param"] == "messages[0].tool_call_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):  # streamer has no chat template... and is a text model
        await in_thread(lambda: sync_client.chat.completions.create(model="nope", messages=plain))
    with pytest.raises(openai.BadRequestError) as no_template:
        await in_thread(lambda: sync_client.chat.completions.create(model="streamer", messages=plain))
    assert no_template.value.body["code"] == "model_not_supported"  # type: ignore[index]


@pytest.mark.parametrize(
    ("changes", "param", "code"),
    [
        ({"logprobs": 2}, "logprobs", "unsupported_parameter"),
        ({"echo": True}, "echo", "unsupported_parameter"),
        ({"best_of": 3}, "best_of", "unsupported_parameter"),
        ({"frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"top_p": 0.5, "model": "streamer"}, "top_p", None),  # streamer does not sample
        ({"top_p": 1.5}, "top_p", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"n": 65}, "n", "invalid_value"),
        ({"stop": ["a"] * 17}, "stop", "invalid_value"),
        ({"prompt": [1, 2, 3]}, "prompt", "invalid_value"),
        ({"max_tokens": -1}, "max_tokens", "invalid_value"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"bogus": 1}, "bogus", "unsupported_parameter"),
    ],
)
async def test_bad_parameters_are_400_in_openai_shape(
    ai_server: Server, changes: dict[str, Any], param: str, code: str | None
) -> None:
    assert ai_server.http_url is not None
    body = {"model": "text", "prompt": "x", "max_tokens": 3, **changes}
    async with httpx.AsyncClient(base_url=ai_server.http_url) as client:
        reply = await client.post("/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if param == "top_p" and code is None:
        assert error["message"] == "parameter 'top_p' is not supported by this model"
    else:
        assert (error["param"], error["code"]) == (param, code)


async def test_neutral_values_of_unsupported_parameters_pass(sync_client: openai.OpenAI) -> None:
    reply = await in_thread(
        lambda: sync_client.completions.create(
            model="streamer", prompt="n", max_tokens=1, logprobs=None, echo=False, presence_penalty=0, top_p=1
        )
    )
    assert reply.choices[0].text == "n:0"


async def test_errors_of_the_engine_and_of_http_keep_the_openai_shape(
    ai_server: Server, sync_client: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:  # the model's own limit
        await in_thread(lambda: sync_client.completions.create(model="text", prompt="x", max_tokens=5000))
    assert "max_tokens" in caught.value.message
    with pytest.raises(openai.BadRequestError) as sampling:
        await in_thread(lambda: sync_client.completions.create(model="streamer", prompt="x", temperature=0.2))
    assert "'temperature' is not supported" in sampling.value.message
    assert ai_server.http_url is not None
    async with httpx.AsyncClient(base_url=ai_server.http_url) as client:
        not_json = await client.post("/v1/chat/completions", content=b"{nope")
        wrong_method = await client.get("/v1/completions")
        no_route = await client.post("/v1/embeddings", json={})
        missing = await client.post("/v1/chat/completions", json={"model": "text"})
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert no_route.status_code == 404 and no_route.json()["error"]["code"] == "unknown_url"
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
