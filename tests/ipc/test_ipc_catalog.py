"""A front remembers model_info / metadata answers and asks again only after the engine
pushes ModelsChanged (a load, unload, default version or workers change)."""

from __future__ import annotations

import attrs
import pytest
from link_support import builtin, engine_and_path

from actorserve.api import ModelState
from actorserve.errors import ModelNotFound
from actorserve.ipc import open_engine_client


async def test_answers_are_remembered_until_the_models_change() -> None:
    async with engine_and_path() as (engine, path), open_engine_client(path) as client:
        info = await client.model_info("streamer")
        meta = await client.metadata("streamer")
        sent = client.link_statistics().messages_sent
        for _ in range(3):
            assert await client.model_info("streamer") == info == await engine.model_info("streamer")
            assert await client.metadata("streamer") == meta == await engine.metadata("streamer")
        assert client.link_statistics().messages_sent == sent  # no round trip
        await client.set_workers("streamer", 2, grace=0)
        assert (await client.model_info("streamer")).workers == 2
        assert client.link_statistics().messages_sent == sent + 2  # set_workers, model_info again


async def test_an_unload_is_seen_at_once_by_the_front_that_asked_and_the_others() -> None:
    async with (
        engine_and_path() as (_, path),
        open_engine_client(path) as a,
        open_engine_client(path) as b,
    ):
        assert (await a.model_info("gate")).state is ModelState.READY
        assert (await b.model_info("gate")).state is ModelState.READY
        await a.unload("gate", grace=0)
        with pytest.raises(ModelNotFound, match="'gate' is not loaded"):
            await a.model_info("gate")  # the push came ahead of the unload's reply
        await b.ready()  # any later round trip on b's link comes after the push
        with pytest.raises(ModelNotFound, match="'gate' is not loaded"):
            await b.model_info("gate")
        with pytest.raises(ModelNotFound):  # errors are never remembered
            await b.metadata("gate")


async def test_a_new_version_and_a_default_version_change_are_seen() -> None:
    async with engine_and_path() as (engine, path), open_engine_client(path) as client:
        assert (await client.metadata("identity")).versions == ("1",)
        assert (await client.model_info("identity")).version == "1"
        await engine.load(attrs.evolve(builtin("identity"), version="2"))
        await client.ready()
        assert (await client.metadata("identity")).versions == ("1", "2")
        assert (await client.model_info("identity")) == await engine.model_info("identity")
        await client.set_default_version("identity", "1")
        assert (await client.model_info("identity")).version == "1"
        await client.set_default_version("identity", "2")
        assert (await client.model_info("identity")).version == "2"
        await engine.unload("identity", "2", grace=0)
        await client.ready()
        assert (await client.model_info("identity")).version == "1"
        assert (await client.metadata("identity")).versions == ("1",)
