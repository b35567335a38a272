"""The unary calls across the engine link: EngineClient.call(record) answers as the
engine's own call, and a front that sends a malformed call gets that call refused with
BadInput while the link serves on."""

from __future__ import annotations

import attrs
import pytest
import trio
from link_support import engine_and_path

from actorserve.api import EngineAPI, UnaryCall
from actorserve.engine import Engine
from actorserve.errors import BadInput, ModelNotFound
from actorserve.ipc import open_engine_client
from actorserve.ipc.frames import Call, Failed, FrameDecoder, Message, Reply, encode_frame, encode_message
from actorserve.unary import BY_NAME, UNARY_CALLS, Route
from actorserve.unary_records import (
    Describe,
    GetInferenceStatistics,
    GetMetadata,
    GetModelInfo,
    GetRepositoryIndex,
    GetStatistics,
    IsReady,
    ListModels,
    SetDefaultVersion,
    SetWorkers,
    Unload,
    WaitIdle,
)


async def test_client_call_answers_as_the_engine_call() -> None:
    async with engine_and_path() as (engine, path), open_engine_client(path) as client:
        for request in [
            IsReady(),
            ListModels(),
            GetModelInfo("rec"),
            GetMetadata("identity", "1"),
            GetRepositoryIndex(),
            GetStatistics("rec"),
            Describe("streamer"),
            GetInferenceStatistics(),
            GetInferenceStatistics("rec", "1"),
        ]:
            assert await client.call(request) == await engine.call(request), request
        await client.call(SetWorkers("rec", 2, grace=0))
        assert (await client.call(GetModelInfo("rec"))).workers == 2  # seen at once (ModelsChanged)
        await client.call(SetDefaultVersion("rec", "1"))
        await client.call(Unload("gate", grace=0))
        await client.call(WaitIdle())
        with pytest.raises(ModelNotFound, match="'gate' is not loaded"):
            await client.call(GetModelInfo("gate"))


async def test_the_named_methods_and_call_share_what_is_remembered() -> None:
    """model_info / metadata look their remembered answer up without building a record
    (the hot path); call(record) finds the same answer, and each asks once."""
    async with engine_and_path() as (_, path), open_engine_client(path) as client:
        info = await client.call(GetModelInfo("streamer"))
        meta = await client.metadata("streamer", "1")
        sent = client.link_statistics().messages_sent
        assert await client.model_info("streamer") is info
        assert await client.call(GetMetadata("streamer", "1")) is meta
        assert client.link_statistics().messages_sent == sent
        assert await client.model_info("streamer", "1") == info  # another key: one round trip
        assert client.link_statistics().messages_sent == sent + 1


@attrs.frozen
class NameOf(UnaryCall[str]):
    """A call that is only a record and a row (and an Engine method): no EngineClient
    method, so the front reaches it by ``call`` only."""

    name: str
    version: str | None = None


async def test_a_new_row_is_served_in_both_shapes_with_no_other_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe of docs/architecture.md ("A new engine-link message"): the generator
    writes a record and its row from the EngineAPI method (tests/test_unary.py); given
    them and the Engine's method, both Engine.call and EngineClient.call serve it, with
    no ipc/ edit; its result type (str) crosses by the codec table."""
    row = Route("name_of", NameOf)
    monkeypatch.setitem(UNARY_CALLS, NameOf, row)
    monkeypatch.setitem(BY_NAME, "name_of", row)
    monkeypatch.setattr(Engine, "name_of", _version_name, raising=False)
    async with engine_and_path() as (engine, path), open_engine_client(path) as client:
        assert await engine.call(NameOf("rec")) == await client.call(NameOf("rec", "1")) == "rec/1"
        with pytest.raises(ModelNotFound, match="'nope' is not loaded"):
            await client.call(NameOf("nope"))


async def _version_name(engine: EngineAPI, name: str, version: str | None = None) -> str:
    info = await engine.model_info(name, version)
    return f"{info.name}/{info.version}"


async def exchange(stream: trio.SocketStream, decoder: FrameDecoder, message: Message) -> Message:
    await stream.send_all(encode_frame([encode_message(message)]))
    with trio.fail_after(10):
        while (frame := decoder.next_frame()) is None:
            data = await stream.receive_some(65536)
            assert data, "the engine closed the link"
            decoder.feed(data)
    (reply,) = frame
    return reply


async def test_a_malformed_call_fails_alone_and_the_link_serves_on() -> None:
    async with engine_and_path() as (_, path):
        stream = await trio.open_unix_socket(path)
        async with stream:
            decoder = FrameDecoder(1 << 20)
            for call_id, (method, args, message) in enumerate(
                [
                    ("reboot", {}, "the engine has no method 'reboot'"),
                    ("unload", {"name": None}, "unload: name must be a string, got None"),
                    ("set_workers", {"name": "rec"}, "set_workers: workers is required"),
                    ("model_info", {"name": "rec", "grace": 1}, "model_info: unexpected arguments ['grace']"),
                ],
                1,
            ):
                assert await exchange(stream, decoder, Call(call_id, method, args)) == Failed(
                    call_id, BadInput.__name__, message
                )
            assert await exchange(stream, decoder, Call(9, "ready", {})) == Reply(9, True)
