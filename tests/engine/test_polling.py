"""``--poll-repository``: real model folders watched by the engine. Each look at the
folders runs in a worker thread, which MockClock's autojump would take for idleness
(jumping to the test's own deadline), so the watching test runs on the real clock
with a small interval; the test of the default (no watching) uses MockClock."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

import actorserve
from actorserve.api import ModelState, RepositoryEntry
from actorserve.engine import Engine
from actorserve.engine.repository import ModelRepository
from actorserve.settings import Settings

IDENTITY = "actorserve.models.identity.IdentityModel"
#: seconds between looks at the folders in these tests
INTERVAL = 0.05


def write_model(root: Path, folder: str, settings: dict[str, Any] | str) -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    text = settings if isinstance(settings, str) else json.dumps(settings)
    (root / folder / "model-settings.json").write_text(text)


async def until(engine: Engine, check: Callable[[list[RepositoryEntry]], bool]) -> list[RepositoryEntry]:
    """The repository index once ``check`` holds (virtual seconds, bounded)."""
    with trio.fail_after(10):
        while True:
            index = await engine.repository_index()
            if check(index):
                return index
            await trio.sleep(INTERVAL / 2)


def state(index: list[RepositoryEntry], name: str, version: str = "1") -> tuple[ModelState, str] | None:
    for entry in index:
        if (entry.name, entry.version) == (name, version):
            return entry.state, entry.reason
    return None


async def test_added_changed_removed_and_broken_folders(tmp_path: Path) -> None:
    write_model(tmp_path, "echo", {"name": "echo", "implementation": IDENTITY})
    repository = ModelRepository((tmp_path,))
    settings = Settings(models=tuple(repository.discover()), poll_repository=INTERVAL)
    async with actorserve.open_engine(settings, repository=repository) as engine:
        write_model(tmp_path, "late", {"name": "late", "implementation": IDENTITY})
        await until(engine, lambda index: state(index, "late") == (ModelState.READY, ""))

        write_model(tmp_path, "late", {"name": "late", "implementation": IDENTITY, "max_pending": 7})
        with trio.fail_after(10):
            while True:  # reloaded with the new settings
                if (await engine.describe("late")).max_pending == 7:
                    break
                await trio.sleep(INTERVAL / 2)

        write_model(tmp_path, "broken", "{not json")
        index = await until(engine, lambda index: state(index, "broken", "") is not None)
        entry = state(index, "broken", "")
        assert entry is not None and entry[0] is ModelState.UNAVAILABLE
        assert entry[1].startswith(f"{tmp_path / 'broken' / 'model-settings.json'}: invalid JSON")
        assert state(index, "echo") == (ModelState.READY, "")  # everything else keeps serving

        shutil.rmtree(tmp_path / "late")
        index = await until(
            engine, lambda index: state(index, "late") == (ModelState.UNAVAILABLE, "unloaded")
        )
        assert [m.name for m in await engine.models()] == ["echo"]

        write_model(tmp_path, "broken", {"name": "broken", "implementation": IDENTITY})  # fixed
        index = await until(engine, lambda index: state(index, "broken") == (ModelState.READY, ""))
        assert state(index, "broken", "") is None


async def test_off_by_default(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    write_model(tmp_path, "echo", {"name": "echo", "implementation": IDENTITY})
    repository = ModelRepository((tmp_path,))
    async with actorserve.open_engine(
        Settings(models=tuple(repository.discover())), repository=repository
    ) as engine:
        write_model(tmp_path, "late", {"name": "late", "implementation": IDENTITY})
        await trio.sleep(600)
        assert [m.name for m in await engine.models()] == ["echo"]
        assert state(await engine.repository_index(), "late") == (ModelState.UNAVAILABLE, "not loaded")
