"""The playground in a real Chromium against the ``transformers`` runtime: it lists the
LLM, streams its text, and continues a sequence; the page's text is exactly what the
API answers (the prompt alone, then the whole history re-sent)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from support.browser import BROWSER_TIMEOUT, chromium_page
from support.tiny_llm import build

from actorserve.modelsettings import model_settings_from_dict
from actorserve.server.composition import Server

pytest.importorskip("transformers")

MAX_TOKENS = 16


@pytest.fixture
async def server(launch: Callable[..., Awaitable[Server]], tmp_path: Path) -> Server:
    folder = build(tmp_path / "llm", "gpt2", dtype="float32")
    data = {"name": "llm", "implementation": "transformers", "parameters": {"dtype": "float32"}}
    return await launch(models=(model_settings_from_dict(data, folder=folder),))


def drive(base_url: str) -> dict[str, Any]:
    """Runs in a worker thread (see test_playground_browser for the event loop policy)."""
    from playwright.sync_api import expect

    got: dict[str, Any] = {}
    with chromium_page() as (page, errors):
        page.goto(f"{base_url}/")
        expect(page.locator("#model")).to_have_attribute("data-ready", "true")
        got["models"] = page.locator("#model option:not([disabled])").all_inner_texts()
        page.select_option("#model", "llm")
        page.fill("#max-tokens", str(MAX_TOKENS))
        page.fill("#temperature", "0")
        page.check("#continue")

        def send(text: str) -> str:
            page.fill("#prompt", text)
            page.click("#generate")
            expect(page.locator("#output")).to_have_attribute("data-state", "done")
            return page.locator("#output .generated").last.text_content() or ""

        got["first"] = send("ROMEO:\n")
        got["second"] = send("JULIET:\n")
        got["transcript"] = page.locator("#output").inner_text()
        got["errors"] = errors
    return got


@pytest.mark.usefixtures("chromium")
async def test_playground_lists_streams_and_continues_the_llm(server: Server) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        got = await trio.to_thread.run_sync(drive, str(server.http_url))
    assert got["errors"] == []
    assert "llm" in got["models"]

    async def generate(prompt: str) -> str:
        body = {"text_input": prompt, "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
        async with httpx.AsyncClient(base_url=str(server.http_url), timeout=BROWSER_TIMEOUT) as client:
            reply = await client.post("/v2/models/llm/generate", json=body)
        assert reply.status_code == 200, reply.text
        return str(reply.json()["text_output"])

    first = await generate("ROMEO:\n")
    assert got["first"] == first != ""
    assert got["second"] == await generate("ROMEO:\n" + first + "JULIET:\n")
    assert got["transcript"] == "ROMEO:\n" + first + "JULIET:\n" + got["second"]
