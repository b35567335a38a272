"""Shared pieces of the gRPC end-to-end tests: a real server on 127.0.0.1 port 0, small
models the tests steer, and helpers for clients that run outside trio.

Clients run in worker threads: ``tritonclient.grpc`` (synchronous) directly, the
betterproto2/grpclib stub on its own plain asyncio loop. The server side (engine,
models, gates) is reached from those threads with ``trio.from_thread``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import numpy as np
import pytest
import support.models
import trio
import trio.testing

import actorserve
from actorserve import BatchModel, InferenceRequest, InferenceResponse, Model, ModelSettings, StepOutput
from actorserve.api import ModelStatistics
from actorserve.codecs import tensor_from_numpy
from actorserve.model import int_parameter
from actorserve.models import builtin_settings as builtin_models
from actorserve.server.doors import serve_grpc
from actorserve.settings import SequenceSettings, Settings

T = TypeVar("T")


class GateModel(support.models.GateModel):
    """The shared gate model, with one token and no free ones by default, and a unary
    ``predict`` answering with the last response."""

    default_tokens = 1
    default_free = 0

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        responses = [r async for r in self.predict_stream(_one(request))]
        return responses[-1] if responses else self.response(request, [])


class FailModel(Model):
    """Always raises: a model failure."""

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        raise RuntimeError("boom")


def _int_input(request: InferenceRequest) -> int:
    tensor = request.input("INPUT")
    assert tensor is not None
    return int(tensor.data.reshape(-1)[0])


class SumModel(Model):
    """Stream in, one response out: the sum of every request's ``INPUT`` (INT64 [1])."""

    stream_input = True

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        total, last = 0, None
        async for request in requests:
            total += _int_input(request)
            last = request
        if last is not None:
            yield self.response(last, [tensor_from_numpy("SUM", np.array([total], dtype=np.int64))])


class RunningSumModel(Model):
    """Stream in, stream out: one response per request with the running sum so far."""

    stream_input = True

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        total = 0
        async for request in requests:
            total += _int_input(request)
            yield self.response(request, [tensor_from_numpy("SUM", np.array([total], dtype=np.int64))])


@attrs.define(eq=False)
class Tick:
    request: InferenceRequest
    tokens: int
    emitted: int = 0


class GatedBatchModel(BatchModel[None, Tick]):
    """A BatchModel whose every step waits for a permit from the test (``permits``), so
    tests count exactly which steps ran. Records the request ids of each step and of
    every cancelled request (``cancelled_event`` is set on the first)."""

    default_max_batch_size = 8

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.permits = threading.Semaphore(0)
        #: steps begun (each waiting for, or past, its permit)
        self.begun = 0
        self.steps: list[list[str]] = []
        self.cancelled: list[str] = []
        self.cancelled_event = trio.Event()

    def begin(self, request: InferenceRequest, state: None) -> Tick:
        return Tick(request, int_parameter(request, "n_tokens", 1, minimum=1))

    def step(self, batch: list[Tick]) -> list[StepOutput]:
        self.begun += 1
        self.permits.acquire()
        self.steps.append([str(w.request.id) for w in batch])
        outputs = []
        for work in batch:
            k = work.emitted
            work.emitted += 1
            response = self.response(
                work.request, [tensor_from_numpy("index", np.array([k], dtype=np.int64))]
            )
            outputs.append(StepOutput(response, done=work.emitted >= work.tokens))
        return outputs

    def on_request_cancelled(self, work: Tick) -> None:
        self.cancelled.append(str(work.request.id))
        self.cancelled_event.set()

    def release_all(self) -> None:
        for _ in range(10_000):
            self.permits.release()


async def _one(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


def test_models() -> tuple[ModelSettings, ...]:
    """The built-in models plus the ones above."""
    return (
        *builtin_models(),
        ModelSettings(name="gate", implementation=GateModel),
        ModelSettings(name="gate1", implementation=GateModel, max_pending=1),
        ModelSettings(name="gateseq", implementation=GateModel, sequence=SequenceSettings(max_queue=1)),
        ModelSettings(name="fail", implementation=FailModel),
        ModelSettings(name="sum", implementation=SumModel),
        ModelSettings(name="running_sum", implementation=RunningSumModel),
        ModelSettings(name="ticker", implementation=GatedBatchModel),
    )


@attrs.define(eq=False)
class GrpcServer:
    """A running gRPC server for one test."""

    engine: actorserve.Engine
    settings: Settings
    host: str
    port: int
    token: trio.lowlevel.TrioToken
    #: cancel it to stop serve_grpc (it drains first); ``stopped`` is set once it returned.
    scope: trio.CancelScope
    stopped: trio.Event

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def model(self, name: str) -> Any:
        return self.engine.model(name)

    def open_gate_from_thread(self, model: str, gate: str) -> None:
        """Open a GateModel's gate from a client thread."""
        trio.from_thread.run_sync(lambda: self.model(model).gates[gate].set(), trio_token=self.token)

    async def statistics_when(
        self, model: str, predicate: Callable[[ModelStatistics], bool], within: float = 10.0
    ) -> ModelStatistics:
        """Let the server run until ``predicate`` holds for ``model``'s statistics
        (re-checked each time every task is blocked, as :func:`wait_until`)."""
        with trio.fail_after(within):
            while not predicate(stats := await self.engine.statistics(model)):
                await trio.testing.wait_all_tasks_blocked()
        return stats

    async def assert_quiet(self) -> None:
        """Nothing in flight anywhere, right now: no request accepted and unanswered,
        waiting for or in a batch, or running in a plain model."""
        for info in await self.engine.models():
            stats = await self.engine.statistics(info.name, info.version)
            assert (stats.inflight, stats.waiting, stats.running) == (0, 0, 0), stats


@asynccontextmanager
async def running_grpc_server(**overrides: Any) -> AsyncIterator[GrpcServer]:
    """Engine with :func:`test_models` + ``serve_grpc`` on 127.0.0.1 port 0."""
    values: dict[str, Any] = {
        "models": test_models(),
        "host": "127.0.0.1",
        "http_port": None,
        "grpc_port": 0,
        "grace_period": 5.0,
    }
    values.update(overrides)
    settings = Settings(**values)
    scope, stopped = trio.CancelScope(), trio.Event()

    async def run_grpc(engine: actorserve.Engine, *, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        try:
            with scope:
                await serve_grpc(engine, settings, task_status=task_status)
        finally:
            stopped.set()

    async with actorserve.open_engine(settings) as engine, trio.open_nursery() as nursery:
        host, port = await nursery.start(run_grpc, engine)
        server = GrpcServer(engine, settings, host, port, trio.lowlevel.current_trio_token(), scope, stopped)
        try:
            yield server
        finally:
            for info in await engine.models():
                for replica in [
                    engine.model(info.name, info.version, replica=i) for i in range(info.workers)
                ]:
                    if isinstance(replica, GatedBatchModel):
                        replica.release_all()
                    if isinstance(replica, GateModel):
                        for gate in list(replica.gates.values()):
                            gate.set()
            nursery.cancel_scope.cancel()


@pytest.fixture
async def grpc_server() -> AsyncIterator[GrpcServer]:
    async with running_grpc_server() as server:
        yield server


async def in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking client function in a worker thread."""
    return await trio.to_thread.run_sync(fn)


async def in_asyncio(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an asyncio client coroutine on a plain asyncio loop in a worker thread.

    The loop is made explicitly: importing trio_asyncio installs an event loop policy
    under which ``asyncio.run`` would give a trio-asyncio loop instead."""

    def run() -> T:
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            return runner.run(fn())

    return await trio.to_thread.run_sync(run)


async def wait_until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Let the server run until ``predicate()`` holds (no sleeping: it re-checks each
    time every task is blocked)."""
    with trio.fail_after(within):
        while not predicate():
            await trio.testing.wait_all_tasks_blocked()
