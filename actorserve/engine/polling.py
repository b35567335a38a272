"""Watching the model folders (``--poll-repository SECONDS``): a model folder added is
loaded, one changed (any file in it) is reloaded, one removed is unloaded; a broken one
is listed in the repository index as UNAVAILABLE with its error while everything else
keeps serving. Off by default: then models load and unload only on request.

One task in the engine's nursery; each look reads the folders in a worker thread (file
metadata only, at most :data:`MAX_FILES` files per model) and is cancellable.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import trio

from ..api import EngineAPI
from ..errors import ModelNotFound
from ..settings import MODEL_SETTINGS_FILE
from .repository import ModelRepository

log = logging.getLogger(__name__)

#: files looked at per model folder (a bound on the work of one look)
MAX_FILES = 1000

#: model name -> what its folders hold (paths, sizes and modification times)
Snapshot = dict[str, tuple[tuple[str, int, int], ...]]


def _model_name(settings_file: Path) -> str:
    """The model's name as the repository will know it (a broken file: its folder's)."""
    try:
        data = json.loads(settings_file.read_text())
        name = data.get("name") if isinstance(data, dict) else None
    except (OSError, ValueError):
        name = None
    return str(name) if name else settings_file.parent.name


def snapshot(repository: ModelRepository) -> Snapshot:
    """What the model folders hold now (blocking file I/O: run it in a thread)."""
    found: dict[str, list[tuple[str, int, int]]] = {}
    for root in repository.folders:
        for settings_file in sorted(Path(root).rglob(MODEL_SETTINGS_FILE)):
            entries = found.setdefault(_model_name(settings_file), [])
            folder = settings_file.parent
            for count, path in enumerate(sorted(folder.rglob("*"))):
                if count >= MAX_FILES:
                    break
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                try:
                    stat = path.stat()
                except OSError:  # removed while we looked: the next look sees it
                    continue
                entries.append((str(path), stat.st_mtime_ns, stat.st_size))
    return {name: tuple(sorted(entries)) for name, entries in found.items()}


async def apply_changes(
    engine: EngineAPI, repository: ModelRepository, before: Snapshot, now: Snapshot
) -> None:
    """Load what was added or changed, unload what was removed (and versions gone from a
    changed model). Failures are logged and left in the index; nothing raises."""
    for name in sorted(set(before) - set(now)):
        try:
            await engine.unload(name)
            log.info("repository poll: %s was removed from the model folders: unloaded", name)
        except ModelNotFound:
            pass
    for name in sorted(n for n in now if before.get(n) != now[n]):
        what = "added" if name not in before else "changed"
        try:
            await engine.load_from_repository(name)
        except Exception as exc:
            log.warning("repository poll: %s was %s but does not load: %s", name, what, exc)
            continue
        log.info("repository poll: %s was %s: loaded", name, what)
        on_disk = {m.version for m in repository.find(name)} if name in now else set()
        for info in await engine.models():
            if info.name == name and info.version not in on_disk:
                await engine.unload(name, info.version)
                log.info("repository poll: %s version %s was removed: unloaded", name, info.version)


async def poll_repository(
    engine: EngineAPI,
    repository: ModelRepository,
    interval: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Every ``interval`` seconds, bring the loaded models in line with the folders.
    The first look (before ``started``) is the baseline: what is loaded already."""
    before = await trio.to_thread.run_sync(snapshot, repository)
    log.info("watching the model folders every %.3g s", interval)
    task_status.started()
    while True:
        await trio.sleep(interval)
        now = await trio.to_thread.run_sync(snapshot, repository, abandon_on_cancel=True)
        if now != before:
            await apply_changes(engine, repository, before, now)
        before = now
