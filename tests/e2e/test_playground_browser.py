"""The browser playground at ``GET /``: its files, the sequence id in GET stream events,
and a real Chromium (Playwright's sync API in a worker thread) typing a prompt, watching
the text stream in, continuing the sequence and ending it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from httpx_sse import aconnect_sse
from support.browser import BROWSER_TIMEOUT, CHROMIUM, FLAGS

from actorserve.models import builtin_settings as builtin_models
from actorserve.models.text import TextModel
from actorserve.models.textlm.network import generate
from actorserve.server.composition import Server
from actorserve.transport.playground import FILES


@pytest.fixture
async def server(launch: Callable[..., Awaitable[Server]]) -> Server:
    """A server with every built-in model, the text model included (the shared fixture
    leaves it out)."""
    return await launch(models=tuple(builtin_models()))


def text_model(server: Server) -> TextModel:
    model = server.engine.model("text")
    assert isinstance(model, TextModel)
    return model


async def test_playground_files_are_served(client: httpx.AsyncClient) -> None:
    types = {}
    for path in FILES:
        reply = await client.get(path)
        assert reply.status_code == 200
        types[path] = reply.headers["content-type"]
    assert types == {
        "/": "text/html; charset=utf-8",
        "/playground/models.js": "text/javascript; charset=utf-8",
        "/playground/playground.js": "text/javascript; charset=utf-8",
        "/playground/playground.css": "text/css; charset=utf-8",
    }
    page = (await client.get("/")).text
    assert '<script src="/playground/playground.js" defer></script>' in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from elsewhere
    missing = await client.get("/playground/missing.js")
    assert (missing.status_code, missing.json()) == (
        404,
        {"error": "no such endpoint: GET /playground/missing.js"},
    )


async def test_get_stream_events_carry_the_sequence_id(client: httpx.AsyncClient, server: Server) -> None:
    """A browser's EventSource cannot read the sequence-id header: the events name it."""
    query = {"text_input": "ROMEO:\n", "max_tokens": "3", "temperature": "0", "sequence_start": "true"}
    async with aconnect_sse(client, "GET", "/v2/models/text/generate_stream", params=query) as source:
        header = source.response.headers["sequence-id"]
        events = [e async for e in source.aiter_sse()]
    assert [e.event for e in events] == ["message"] * 3 + ["end"]
    assert {json.loads(e.data)["sequence_id"] for e in events[:-1]} == {header}
    query = {"text_input": "x", "max_tokens": "2", "sequence_id": header, "sequence_end": "true"}
    async with aconnect_sse(client, "GET", "/v2/models/text/generate_stream", params=query) as source:
        events = [e async for e in source.aiter_sse()]
    assert [json.loads(e.data)["sequence_id"] for e in events[:-1]] == [header] * 2
    # Without a sequence the events are Triton's generate shape, unchanged.
    query = {"text_input": "ROMEO:\n", "max_tokens": "1", "temperature": "0"}
    async with aconnect_sse(client, "GET", "/v2/models/text/generate_stream", params=query) as source:
        events = [e async for e in source.aiter_sse()]
    first = generate(text_model(server).core, "ROMEO:\n", 1, temperature=0)
    assert json.loads(events[0].data) == {"model_name": "text", "model_version": "1", "text_output": first}


# -- the page in Chromium ----------------------------------------------------------------------


def drive_playground(
    base_url: str, screenshot: Path, open_sequences: Callable[[], list[str]]
) -> dict[str, Any]:
    """Runs in a worker thread; ``open_sequences()`` is called on the trio thread (through
    ``trio.from_thread``) between the two prompts and after the sequence was ended."""

    from playwright.sync_api import expect, sync_playwright

    # Playwright's sync API makes an asyncio loop in this thread. Once trio-asyncio is
    # imported (by the gRPC transport) its policy would hand out a trio-asyncio loop;
    # outside trio it makes the policy thread-local, so ask for a plain one here only.
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    try:
        return _drive(base_url, screenshot, open_sequences, expect, sync_playwright)
    finally:
        asyncio.set_event_loop_policy(None)


def _drive(
    base_url: str,
    screenshot: Path,
    open_sequences: Callable[[], list[str]],
    expect: Any,
    sync_playwright: Any,
) -> dict[str, Any]:
    async def settled_sequences() -> list[str]:
        await trio.testing.wait_all_tasks_blocked()  # the ended sequence's actor finishes
        return open_sequences()

    got: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            urls: list[str] = []
            page.on("request", lambda request: urls.append(request.url))
            page.goto(f"{base_url}/")
            expect(page.locator("#model")).to_have_attribute("data-ready", "true")
            got["models"] = page.locator("#model option:not([disabled])").all_inner_texts()
            got["selected"] = page.locator("#model").input_value()

            page.fill("#max-tokens", "60")
            page.fill("#temperature", "0")
            page.check("#continue")
            page.fill("#prompt", "ROMEO:\n")
            page.click("#generate")
            # The text appears while the stream runs, then the stream ends.
            expect(page.locator("#output .generated")).not_to_have_text("")
            expect(page.locator("#output")).to_have_attribute("data-state", "done")
            got["first"] = page.locator("#output .generated").last.text_content()
            got["first_events"] = page.locator("#output").get_attribute("data-events")
            got["stats"] = page.locator("#stats").inner_text()
            got["sequence_shown"] = page.locator("#sequence-id").inner_text()
            got["between"] = trio.from_thread.run_sync(open_sequences)

            page.fill("#prompt", "JULIET:\n")
            page.press("#prompt", "Control+Enter")
            expect(page.locator("#output")).to_have_attribute("data-events", "60")
            expect(page.locator("#output")).to_have_attribute("data-state", "done")
            got["second"] = page.locator("#output .generated").last.text_content()
            got["transcript"] = page.locator("#output").inner_text()
            page.screenshot(path=str(screenshot), full_page=True)

            page.click("#forget")
            expect(page.locator("#sequence")).to_be_hidden()
            expect(page.locator("body")).to_have_attribute("data-ended-sequence", got["sequence_shown"])
            got["after_end"] = trio.from_thread.run(settled_sequences)
            got["stream_urls"] = [u for u in urls if "generate_stream" in u]
            got["errors"] = errors
        finally:
            browser.close()
    return got


@pytest.mark.usefixtures("chromium")
async def test_playground_streams_and_continues_a_sequence(server: Server, tmp_path: Path) -> None:
    model = text_model(server)
    screenshot = tmp_path / "playground.png"

    def open_sequences() -> list[str]:
        return sorted(model.sequences)

    with trio.fail_after(BROWSER_TIMEOUT):
        got = await trio.to_thread.run_sync(
            drive_playground, str(server.http_url), screenshot, open_sequences
        )

    first = generate(model.core, "ROMEO:\n", 60, temperature=0)
    second = generate(model.core, "ROMEO:\n" + first + "JULIET:\n", 60, temperature=0)
    assert got["selected"] == "text"
    assert {"text", "streamer"} <= set(got["models"])
    assert "accumulator (raw OIP)" in got["models"]  # it takes INT64 INPUT: no prompt box
    assert (got["first"], got["first_events"]) == (first, "60")
    assert re.fullmatch(r"60 tokens · \d+ tok/s · first token \d+ ms", got["stats"])
    sequence_id = got["sequence_shown"]
    assert got["between"] == [sequence_id]  # the engine held the sequence open between prompts
    assert got["second"] == second
    assert got["transcript"] == "ROMEO:\n" + first + "JULIET:\n" + second
    assert got["after_end"] == []
    start, more = got["stream_urls"]
    assert "sequence_start=true" in start
    assert "sequence_id" not in start
    assert f"sequence_id={sequence_id}" in more
    assert "sequence_start" not in more
    assert got["errors"] == []
    assert screenshot.stat().st_size > 10_000
