"""Issue 19, finding 10: ``.mar`` extraction had no size or member limit, ran on the
engine's event loop (a 1 MiB archive of 1 GiB zeros stalled every model 5.7 s) and
made a new copy on every load."""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from support.pace import pace
from support.servers import start_server

from actorserve.engine.repository import ModelRepository
from actorserve.models import builtin_settings
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings, SettingsError
from actorserve.tempdirs import is_temp_folder
from actorserve.torchserve.archive import ArchiveLimits, archive_name, archive_settings

MIB = 1024 * 1024
HANDLER = b"def handle(data, context):\n    return [len(data)]\n"


def make_mar(path: Path, *, zeros: int = 0, members: int = 0) -> Path:
    """A ``.mar`` named by ``path``: a manifest, a handler, ``zeros`` bytes of zeros in
    one member and ``members`` more empty files (deflated: a bomb is small on disk)."""
    manifest = {"model": {"modelName": path.stem, "handler": "handler.py", "modelVersion": "1.0"}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("handler.py", HANDLER)
        if zeros:
            with archive.open("zeros.bin", "w", force_zip64=True) as out:
                block = bytes(MIB)
                for _ in range(zeros // MIB):
                    out.write(block)
        for i in range(members):
            archive.writestr(f"extra/{i}.txt", b"")
    return path


def extractions(stem: str) -> set[str]:
    root = Path(tempfile.gettempdir())
    return {p.name for p in root.iterdir() if is_temp_folder(p, f"mar-{stem}")}


def test_an_archive_over_max_archive_bytes_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    mar = make_mar(tmp_path / "bomb.mar", zeros=8 * MIB)
    assert mar.stat().st_size < 64 * 1024  # 8 MiB of zeros in a few KiB
    before = extractions("bomb")
    with pytest.raises(SettingsError, match=r"more than max_archive_bytes \(4194304 bytes\)"):
        archive_settings(mar, limits=ArchiveLimits(max_bytes=4 * MIB))
    assert extractions("bomb") == before
    assert archive_settings(mar, limits=ArchiveLimits(max_bytes=16 * MIB)).name == "bomb"


def test_a_member_that_lies_about_its_size_is_not_extracted_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A central directory that understates a member's size: zipfile reads no further
    than the header says (and fails its CRC), so nothing past the limit is written; the
    extraction also counts the bytes it writes, in case a zip reader ever trusts less."""
    mar = make_mar(tmp_path / "liar.mar", zeros=8 * MIB)
    real = zipfile.ZipFile.infolist

    def lying(self: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
        infos = real(self)
        for info in infos:
            if info.filename == "zeros.bin":
                info.file_size = 1024
        return infos

    monkeypatch.setattr(zipfile.ZipFile, "infolist", lying)
    before = extractions("liar")
    with pytest.raises(SettingsError, match=r"not a readable \.mar archive"):
        archive_settings(mar, limits=ArchiveLimits(max_bytes=4 * MIB))
    assert extractions("liar") == before


def test_an_archive_over_max_archive_members_is_refused(tmp_path: Path) -> None:
    mar = make_mar(tmp_path / "many.mar", members=50)
    with pytest.raises(SettingsError, match=r"has 52 members, more than max_archive_members \(10\)"):
        archive_settings(mar, limits=ArchiveLimits(max_members=10))


def test_a_huge_manifest_is_not_read(tmp_path: Path) -> None:
    mar = tmp_path / "fat.mar"
    with zipfile.ZipFile(mar, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            "MAR-INF/MANIFEST.json", b'{"model": {"modelName": "other"}, "pad": "' + b" " * (2 * MIB) + b'"}'
        )
        archive.writestr("handler.py", HANDLER)
    assert archive_name(mar) == "fat"  # named by its file, unread
    with pytest.raises(SettingsError, match="larger than 1048576 bytes"):
        archive_settings(mar)


def test_an_unchanged_archive_is_extracted_once(tmp_path: Path) -> None:
    mar = make_mar(tmp_path / "again.mar")
    before = extractions("again")
    first = archive_settings(mar).folder
    assert archive_settings(mar).folder == first
    assert len(extractions("again") - before) == 1
    make_mar(mar, zeros=MIB)  # changed: size and mtime differ
    os.utime(mar, ns=(mar.stat().st_atime_ns, mar.stat().st_mtime_ns + 10**9))
    assert archive_settings(mar).folder != first


async def _served(nursery: trio.Nursery, store: Path, **changes: Any) -> Server:
    values: dict[str, Any] = {
        "http_port": 0,
        "grpc_port": None,
        "host": "127.0.0.1",
        "no_auth": True,
        "api_workers": 0,
        "models": tuple(m for m in builtin_settings() if m.name == "identity"),
    }
    values.update(changes)
    server: Server = await nursery.start(
        partial(serve, Settings(**values), repository=ModelRepository((store,)))
    )
    return server


async def test_a_bomb_registered_over_rest_is_refused_naming_the_setting(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    make_mar(tmp_path / "bomb.mar", zeros=8 * MIB)
    server = await _served(nursery, tmp_path, max_archive_bytes=4 * MIB)
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as client:
        reply = await client.post("/models", params={"url": "bomb.mar"})
    assert 400 <= reply.status_code < 500, reply.text
    assert "max_archive_bytes" in reply.text


async def test_extracting_a_large_archive_does_not_stall_other_requests(tmp_path: Path) -> None:
    """The extraction runs in a worker thread: health probes sent meanwhile to the
    server (its own process, ``--api-workers 0``: engine and REST share one loop)
    keep being answered, each within 25 paces of this machine (``support.pace``: ~0.25 s
    idle, more when the machine is busy). Before, 256 MiB of zeros stalled it about half a
    second."""
    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "model-settings.json").write_text(
        json.dumps({"name": "identity", "implementation": "actorserve.models.identity.IdentityModel"})
    )
    args = ("--http-port", "0", "--grpc-port", "off", "--api-workers", "0", "--no-auth", str(tmp_path))
    server = start_server(*args)
    try:
        url = server.wait_for(r"REST listening on (http://\S+)", 60)[1]
        make_mar(tmp_path / "large.mar", zeros=256 * MIB)  # after the start: not loaded with the folder
        probes: list[float] = []
        answered: list[int] = []  # probes done when the registration was answered
        settled = trio.Event()  # two more since: one held up by a stall may answer after it
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            assert (await client.get("/v2/health/live")).status_code == 200
            unit = pace()  # the bound's unit, measured now: a busy machine widens it

            async def probe() -> None:
                while True:  # cancelled once the registration is answered
                    started = trio.current_time()
                    assert (await client.get("/v2/health/live")).status_code == 200
                    probes.append(trio.current_time() - started)
                    if answered and len(probes) >= answered[0] + 2:
                        settled.set()
                    await trio.sleep(0.01)

            async with trio.open_nursery() as inner:
                inner.start_soon(probe)
                await trio.sleep(0.05)
                with trio.fail_after(60):
                    await client.post("/models", params={"url": "large.mar"})
                    answered.append(len(probes))
                    await settled.wait()
                inner.cancel_scope.cancel()
        assert len(probes) > 3 and max(probes) < 25 * unit, (probes, unit)
    finally:
        server.stop()


def make_escaping_mar(path: Path, **model: str) -> Path:
    """A ``.mar`` whose manifest's ``model`` has ``model``'s fields (over a good handler),
    with a ``model-config.yaml``."""
    manifest = {"model": {"modelName": path.stem, "handler": "handler.py", "modelVersion": "1.0", **model}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("handler.py", HANDLER)
        archive.writestr("model-config.yaml", "batchSize: 3\n")
    return path


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("configFile", "../../../../../../../../proc/self/environ"),
        ("configFile", "/etc/passwd"),
        ("handler", "../../../../../../../../tmp/evil.py"),
        ("handler", "/tmp/evil.py:handle"),
    ],
)
def test_a_manifest_cannot_name_a_file_outside_its_archive(tmp_path: Path, field: str, value: str) -> None:
    """Issue 30, finding 14: ``configFile`` was read and YAML-parsed wherever it pointed
    (``/proc/self/environ``: the engine's secrets), by the engine and every front."""
    mar = make_escaping_mar(tmp_path / "escape.mar", **{field: value})
    with pytest.raises(
        SettingsError, match=rf"the manifest's {field} '{re.escape(value)}' points outside the archive"
    ):
        archive_settings(mar)
    folder = tmp_path / "folder"  # an archive folder (no-archive format): the same
    (folder / "MAR-INF").mkdir(parents=True)
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(folder)
    with pytest.raises(SettingsError, match=rf"the manifest's {field} .* points outside the archive"):
        archive_settings(folder)
    inside = make_escaping_mar(tmp_path / "inside.mar", configFile="./model-config.yaml")
    assert archive_settings(inside).max_batch_size == 3  # a path that stays inside is read


async def test_registering_an_escaping_archive_is_a_400_naming_the_field(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    make_escaping_mar(tmp_path / "escape.mar", configFile="../../../../../../../../proc/self/environ")
    server = await _served(nursery, tmp_path)
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as client:
        reply = await client.post("/models", params={"url": "escape.mar"})
    assert reply.status_code == 400, reply.text
    assert "the manifest's configFile" in reply.json()["message"]
    assert "points outside the archive" in reply.json()["message"]
