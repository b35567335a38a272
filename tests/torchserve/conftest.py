"""Fixtures of the TorchServe tests: archives made by the real ``torch-model-archiver``
from the handlers in ``handlers/``, and a server (``actorserve.serve`` on 127.0.0.1 port
0, REST and gRPC) whose model store is a temporary folder."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
import trio

from actorserve.engine.repository import ModelRepository
from actorserve.models import builtin_settings
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings

HANDLERS = Path(__file__).parent / "handlers"
ARCHIVER = Path(sys.executable).parent / "torch-model-archiver"
TIMEOUT = 20.0

MakeArchive = Callable[..., Path]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """The model store (TorchServe's ``--model-store``)."""
    folder = tmp_path / "store"
    folder.mkdir()
    return folder


@pytest.fixture
def make_archive(store: Path, tmp_path: Path) -> MakeArchive:
    """``make_archive(name, handler, config=None, *, version="1.0", files=(), fmt=None)``:
    run torch-model-archiver on ``handlers/<handler>`` into the store; returns the .mar
    (or, with ``fmt="no-archive"``, the folder)."""

    def make(
        name: str,
        handler: str,
        config: str | None = None,
        *,
        version: str = "1.0",
        files: tuple[str, ...] = (),
        model_file: str | None = None,
        serialized: Path | None = None,
        fmt: str | None = None,
    ) -> Path:
        work = tmp_path / f"src-{name}-{version}"
        work.mkdir(exist_ok=True)
        args = [
            str(ARCHIVER),
            "--model-name",
            name,
            "--version",
            version,
            "--export-path",
            str(store),
            "--force",
        ]
        shutil.copy(HANDLERS / handler, work / handler)
        args += ["--handler", str(work / handler)]
        if config is not None:
            (work / "model-config.yaml").write_text(config)
            args += ["--config-file", str(work / "model-config.yaml")]
        if model_file is not None:
            shutil.copy(HANDLERS / model_file, work / model_file)
            args += ["--model-file", str(work / model_file)]
        if serialized is not None:
            args += ["--serialized-file", str(serialized)]
        if files:
            args += ["--extra-files", ",".join(str(HANDLERS / f) for f in files)]
        if fmt is not None:
            args += ["--archive-format", fmt]
        subprocess.run(args, check=True, capture_output=True, timeout=120)
        return store / name if fmt == "no-archive" else store / f"{name}.mar"

    return make


@pytest.fixture
def doubler_weights(tmp_path: Path) -> Path:
    """The state dict of ``handlers/doubler_model.py``'s Doubler (scale 2)."""
    path = tmp_path / "doubler.pt"
    torch.save({"scale": torch.tensor(2.0)}, path)
    return path


PROTOS = Path(__file__).resolve().parents[2] / "actorserve" / "proto" / "torchserve"


@pytest.fixture(scope="session")
def pb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """inference_pb2(_grpc), management_pb2(_grpc), google.rpc.status_pb2 from the committed protos."""
    out = tmp_path_factory.mktemp("stubs")
    protos = [
        "inference.proto",
        "management.proto",
        "google/rpc/status.proto",
        "google/rpc/error_details.proto",
    ]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *protos,
        ],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(out))
    try:
        names = (
            "inference_pb2",
            "inference_pb2_grpc",
            "management_pb2",
            "management_pb2_grpc",
            "google.rpc.status_pb2",
            "google.rpc.error_details_pb2",
        )
        modules = {name.rpartition(".")[2]: importlib.import_module(name) for name in names}
        yield SimpleNamespace(**modules)
    finally:
        sys.path.remove(str(out))


Launch = Callable[..., Any]


@pytest.fixture
def launch(nursery: trio.Nursery, store: Path) -> Launch:
    """``await launch(*model_settings)``: a server of ts_stateful plus these models, with
    ``store`` as its model store, REST and gRPC on port 0, no token needed (auth is
    tested in tests/e2e/test_auth.py)."""

    async def start(*models: Any, **changes: Any) -> Server:
        stateful = [m for m in builtin_settings() if m.name == "ts_stateful"]
        values: dict[str, Any] = {
            "http_port": 0,
            "grpc_port": 0,
            "host": "127.0.0.1",
            "models": (*stateful, *models),
            "no_auth": True,
        }
        values.update(changes)
        server: Server = await nursery.start(
            partial(serve, Settings(**values), repository=ModelRepository((store,)))
        )
        return server

    return start


@pytest.fixture
async def server(launch: Launch) -> Server:
    result: Server = await launch()
    return result


@pytest.fixture
async def client(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as c:
        yield c
