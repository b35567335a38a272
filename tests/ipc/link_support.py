"""An engine served over the engine link in the test's own trio run: serve_fronts on a
Unix socket in a short temporary directory, and EngineClients connected to it."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import numpy as np
import trio
from support.models import GateModel, recording_settings

import actorserve
from actorserve import InferenceRequest, ModelSettings
from actorserve.codecs import tensor_from_numpy
from actorserve.engine import Engine
from actorserve.ipc import LinkLimits
from actorserve.ipc.engine_side import open_unix_listener, serve_fronts
from actorserve.ipc.frames import DEFAULT_LIMITS
from actorserve.models import builtin_settings as builtin_models
from actorserve.settings import SequenceSettings


def builtin(name: str) -> ModelSettings:
    return next(m for m in builtin_models() if m.name == name)


def link_models(**rec: object) -> list[ModelSettings]:
    """streamer, accumulator, identity, ``rec`` (a RecordingModel) and ``gate``."""
    return [
        builtin("streamer"),
        builtin("accumulator"),
        builtin("identity"),
        recording_settings("rec", sequence=SequenceSettings(), **rec),
        ModelSettings(name="gate", implementation=GateModel),
    ]


@contextmanager
def socket_path() -> Iterator[str]:
    """A fresh path for a Unix socket (short: sun_path holds ~100 bytes)."""
    with tempfile.TemporaryDirectory(prefix="asipc-") as folder:
        yield os.path.join(folder, "engine.sock")


@asynccontextmanager
async def served(
    engine: Engine, path: str, *, limits: LinkLimits = DEFAULT_LIMITS
) -> AsyncIterator[trio.CancelScope]:
    """serve_fronts for ``engine`` at ``path``; cancel the yielded scope to stop it (its
    connections close)."""
    async with trio.open_nursery() as nursery:
        listener = await open_unix_listener(path)
        await nursery.start(functools.partial(serve_fronts, engine, listener, limits=limits))
        yield nursery.cancel_scope
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def engine_and_path(
    *, limits: LinkLimits = DEFAULT_LIMITS, **rec: object
) -> AsyncIterator[tuple[Engine, str]]:
    with socket_path() as path:
        async with actorserve.open_engine(link_models(**rec)) as engine, served(engine, path, limits=limits):
            yield engine, path


def prompt(text: str, **parameters: object) -> InferenceRequest:
    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return InferenceRequest(
        [tensor_from_numpy("text_input", data, "BYTES")], id=text, parameters=dict(parameters)
    )


def add(value: int, request_id: str = "", **parameters: object) -> InferenceRequest:
    return InferenceRequest(
        [tensor_from_numpy("INPUT", np.array([value], dtype=np.int64))],
        id=request_id or None,
        parameters=dict(parameters),
    )
