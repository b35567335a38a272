"""The OpenAI API beyond single requests: stateful chat over a sequence (``extra_body``
and the ``sequence-*`` headers, the OIP's sequence errors), a client that disconnects
mid-stream (its batch slot is freed), and both process shapes of ``python -m actorserve``
(``--api-workers 0`` and ``2``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
import trio
from conftest import TIMEOUT, Launch, leftover_work
from e2e.openai_fixtures import ai_server, in_thread, sync_client
from support.servers import start_server

from actorserve import InferenceRequest, InferenceResponse, Model, ModelSettings
from actorserve.server.composition import Server
from actorserve.textgen import TextGeneration, text_tensor

__all__ = ["ai_server", "sync_client"]  # fixtures


#: a seed whose first reply ends its turn (a blank line) well within max_tokens
SEED = 2


def turn(client: openai.OpenAI, content: str, **extra: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="text", messages=[{"role": "user", "content": content}], max_tokens=200, seed=SEED, **extra
    )


async def test_a_sequence_continues_a_chat_without_its_history(sync_client: openai.OpenAI) -> None:
    first_raw = await in_thread(
        lambda: turn(sync_client, "Speak, friend.", extra_body={"sequence_start": True})
    )
    first = first_raw.parse()
    sequence_id = first_raw.headers["sequence-id"]
    assert first.model_extra["sequence_id"] == sequence_id
    assert first.choices[0].finish_reason == "stop"  # the turn ended at a blank line
    reply = first.choices[0].message.content
    # the next turn sends only the new message: the sequence holds the rest (header form)
    second = (
        await in_thread(lambda: turn(sync_client, "Whither?", extra_headers={"sequence-id": sequence_id}))
    ).parse()
    # the same conversation sent whole, without a sequence, gives the same reply
    history: list[Any] = [
        {"role": "user", "content": "Speak, friend."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Whither?"},
    ]
    whole = await in_thread(
        lambda: sync_client.chat.completions.create(model="text", messages=history, max_tokens=200, seed=SEED)
    )
    assert second.choices[0].message.content == whole.choices[0].message.content
    assert second.usage is not None and second.usage.prompt_tokens == len("USER:\nWhither?\n\nASSISTANT:\n")
    # end it; then it is gone, with the OIP's error
    await in_thread(
        lambda: turn(sync_client, "Farewell.", extra_body={"sequence_id": sequence_id, "sequence_end": True})
    )
    with pytest.raises(openai.NotFoundError) as gone:
        await in_thread(lambda: turn(sync_client, "Hello?", extra_body={"sequence_id": sequence_id}))
    assert gone.value.body["code"] == "sequence_not_found"  # type: ignore[index]
    assert "has ended" in gone.value.message


async def test_sequence_errors_are_those_of_the_oip(sync_client: openai.OpenAI) -> None:
    await in_thread(
        lambda: turn(sync_client, "One.", extra_body={"sequence_id": "chat-7", "sequence_start": True})
    )
    with pytest.raises(openai.ConflictError) as conflict:
        await in_thread(
            lambda: turn(sync_client, "Two.", extra_body={"sequence_id": "chat-7", "sequence_start": True})
        )
    assert conflict.value.body["code"] == "sequence_conflict"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: turn(sync_client, "Who?", extra_body={"sequence_id": "never-started"}))
    with pytest.raises(openai.NotFoundError) as streamed:  # known before the stream starts: a status
        await in_thread(
            lambda: turn(sync_client, "Who?", stream=True, extra_body={"sequence_id": "never-started"})
        )
    # never opened here, on a lone server (no --replica-id): unknown, no proxy blamed
    assert streamed.value.body["code"] == "sequence_not_found"  # type: ignore[index]
    assert "- unknown sequence 'never-started': it is not open on this server" in streamed.value.message
    with pytest.raises(openai.BadRequestError) as many:
        await in_thread(lambda: turn(sync_client, "Two.", n=2, extra_body={"sequence_id": "chat-7"}))
    assert many.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as disagree:
        await in_thread(
            lambda: turn(
                sync_client, "x", extra_body={"sequence_id": "chat-7"}, extra_headers={"sequence-id": "other"}
            )
        )
    assert disagree.value.body["param"] == "sequence_id"  # type: ignore[index]
    # a sequence in a stream: its id comes in the header and in every chunk
    stream = await in_thread(
        lambda: sync_client.completions.with_raw_response.create(
            model="text",
            prompt="more",
            max_tokens=3,
            stream=True,
            extra_body={"sequence_id": "chat-7", "sequence_end": True},
        )
    )
    assert stream.headers["sequence-id"] == "chat-7"
    chunks = await in_thread(lambda: list(stream.parse()))
    assert {c.model_extra["sequence_id"] for c in chunks} == {"chat-7"}


async def test_a_client_that_disconnects_mid_stream_frees_its_slot(
    ai_server: Server, sync_client: openai.OpenAI
) -> None:
    stream = await in_thread(
        lambda: sync_client.completions.create(model="text", prompt="ROMEO:", max_tokens=2048, stream=True)
    )
    chunks = iter(stream)
    got = [await in_thread(lambda: next(chunks)) for _ in range(3)]
    assert all(c.choices[0].finish_reason is None for c in got)
    stats = await ai_server.engine.statistics("text")
    assert stats.running == 1
    await in_thread(stream.close)
    with trio.fail_after(TIMEOUT):
        await ai_server.engine.wait_idle()
    assert await leftover_work(ai_server.engine) == {}
    after = await ai_server.engine.statistics("text")
    assert after.steps - stats.steps < 2048  # it left long before max_tokens


class BreakingText(Model):
    """A text generator that streams two pieces, then fails (a model bug)."""

    text_generation = TextGeneration()

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            for piece in ("tw", "o"):
                yield self.response(request, [text_tensor("text_output", piece)])
            raise RuntimeError("the generator broke")


async def test_an_error_mid_stream_is_the_last_chunk(launch: Launch) -> None:
    server = await launch(models=(ModelSettings(name="breaking", implementation=BreakingText),))
    client = openai.AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="x", timeout=TIMEOUT, max_retries=0)
    stream = await client.completions.create(model="breaking", prompt="x", stream=True)
    texts: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert "".join(texts) == "two"
    assert "model 'breaking' failed: RuntimeError: the generator broke" in caught.value.message
    with pytest.raises(openai.InternalServerError):  # unary: the status says it
        await client.completions.create(model="breaking", prompt="x")


@pytest.fixture(params=[0, 2], ids=["api-workers-0", "api-workers-2"])
def standalone(request: pytest.FixtureRequest) -> Iterator[str]:
    """``python -m actorserve`` serving the built-in models, in either process shape."""
    server = start_server("--http-port", "0", "--grpc-port", "off", "--api-workers", str(request.param))
    try:
        yield server.wait_for(r"REST listening on (http://\S+)", 60.0)[1]
    finally:
        server.stop()


def test_both_process_shapes_serve_the_openai_api(standalone: str) -> None:
    client = openai.OpenAI(base_url=standalone + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    assert sorted(m.id for m in client.models.list().data) == ["streamer", "text"]
    a = client.completions.create(model="text", prompt="ROMEO:", max_tokens=16, seed=4, n=2)
    b = client.completions.create(model="text", prompt="ROMEO:", max_tokens=16, seed=4, n=2)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="text", messages=[{"role": "user", "content": "Hi"}], max_tokens=20, seed=4, stream=True
        )
    )
    unary = client.chat.completions.create(
        model="text", messages=[{"role": "user", "content": "Hi"}], max_tokens=20, seed=4
    )
    assert streamed == unary.choices[0].message.content
    started = turn(client, "Hail.", extra_body={"sequence_start": True})
    sequence_id = started.headers["sequence-id"]
    for _ in range(3):  # new connections: any front serves the sequence
        fresh = openai.OpenAI(base_url=standalone + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        assert (
            turn(fresh, "And?", extra_body={"sequence_id": sequence_id}).headers["sequence-id"] == sequence_id
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
