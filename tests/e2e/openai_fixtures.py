"""Fixtures of the OpenAI-API tests: a real server (``actorserve.serve``) on 127.0.0.1
port 0 serving the ``text`` and ``streamer`` models, and the official ``openai`` clients
pointed at it. The sync client runs in a worker thread (the server shares the test's
trio loop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import openai
import pytest
import trio
from conftest import TIMEOUT, Launch

from actorserve.models import builtin_settings
from actorserve.server.composition import Server

T = TypeVar("T")


def openai_models() -> tuple[Any, ...]:
    return tuple(m for m in builtin_settings() if m.name in ("text", "streamer", "identity"))


@pytest.fixture
async def ai_server(launch: Launch) -> Server:
    return await launch(models=openai_models())


@pytest.fixture
def sync_client(ai_server: Server) -> openai.OpenAI:
    assert ai_server.http_url is not None
    return openai.OpenAI(
        base_url=ai_server.http_url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


@pytest.fixture
def async_client(ai_server: Server) -> openai.AsyncOpenAI:
    assert ai_server.http_url is not None
    return openai.AsyncOpenAI(
        base_url=ai_server.http_url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0
    )


async def in_thread(call: Callable[[], T]) -> T:
    """Run a blocking client call off the trio loop (bounded)."""
    with trio.fail_after(TIMEOUT):
        return await trio.to_thread.run_sync(call)
