"""Pieces of the shutdown tests and ``benchmarks/reliability/shutdown.py``: a slow
streaming model, a server whose return is observable, and stream readers that report how
a stream ended (its last events, or the gRPC status)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import trio
import tritonclient.grpc as grpcclient

from actorserve import InferenceRequest, ModelSettings
from actorserve.models import builtin_settings
from actorserve.models.streamer import StreamerModel
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings

#: what every request the shutdown refuses or ends is told
SHUTTING_DOWN = "the server is shutting down"


class SlowStreamer(StreamerModel):
    """``streamer`` with a default ``delay`` of 20 ms a token: its streams outlive a
    short grace period even when the client cannot pass ``delay`` (OpenAI routes)."""

    def _parse(self, request: InferenceRequest) -> tuple[str, int, float]:
        prompt, n_tokens, delay = super()._parse(request)
        return prompt, n_tokens, delay or 0.02


def shutdown_settings(**changes: Any) -> Settings:
    """127.0.0.1, REST and gRPC on port 0, ``streamer``, ``ts_stateful`` and ``slow``."""
    models = tuple(m for m in builtin_settings() if m.name in ("streamer", "ts_stateful"))
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "http_port": 0,
        "grpc_port": 0,
        "no_auth": True,
        "models": (*models, ModelSettings(name="slow", implementation=SlowStreamer)),
    }
    values.update(changes)
    return Settings(**values)


@attrs.define(eq=False)
class Running:
    """A server started by :func:`start`; ``returned`` is set when ``serve`` returns."""

    server: Server
    returned: trio.Event


async def start(nursery: trio.Nursery, settings: Settings) -> Running:
    returned = trio.Event()

    async def run(*, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve(settings, task_status=task_status)
        finally:
            returned.set()

    server: Server = await nursery.start(run)
    return Running(server, returned)


@attrs.define(eq=False)
class GrpcStream:
    """A ``ModelStreamInfer`` call by tritonclient (its own thread): one request for
    ``n_tokens`` tokens of ``model``. ``results`` counts responses; ``error`` is how the
    call ended (an ``InferenceServerException``), None while it runs."""

    url: str
    model: str = "slow"
    n_tokens: int = 10_000
    #: seconds before each token (``streamer``'s ``delay``; 0: the model's default)
    delay: float = 0.0
    results: int = 0
    error: Any = None
    ended: threading.Event = attrs.field(factory=threading.Event)
    _events: queue.Queue[str] = attrs.field(factory=queue.Queue)
    _client: Any = None

    def open(self) -> None:
        self._client = grpcclient.InferenceServerClient(self.url)
        self._client.start_stream(callback=self._callback)
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"a"], dtype=object))
        parameters: dict[str, Any] = {"n_tokens": self.n_tokens}
        if self.delay:
            parameters["delay"] = self.delay
        self._client.async_stream_infer(self.model, [text], request_id="1", parameters=parameters)

    def _callback(self, result: Any, error: Any) -> None:
        if error is not None:
            self.error = error
            self.ended.set()
        else:
            self.results += 1

    def close(self) -> None:
        if self._client is not None:
            self._client.stop_stream(cancel_requests=True)
            self._client.close()


async def wait_until(condition: Callable[[], bool], bound: float = 10.0, step: float = 0.01) -> None:
    """Poll ``condition`` (a look at a client thread's state) until true; fail after ``bound`` s."""
    with trio.fail_after(bound):
        while not condition():  # noqa: ASYNC110 (a thread's state: no event to wait on)
            await trio.sleep(step)
