"""The playground's chat mode in a real Chromium: messages stream from
``POST /v1/chat/completions`` (the OpenAI API), a conversation continues over a sequence
(only the new message is sent) or, without one, by resending the history; the page's
text is exactly what the API gives."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio
from support.browser import BROWSER_TIMEOUT, chromium_page

from actorserve.models import builtin_settings as builtin_models
from actorserve.server.composition import Server

MAX_TOKENS = 40


@pytest.fixture
async def server(launch: Callable[..., Awaitable[Server]]) -> Server:
    return await launch(models=tuple(m for m in builtin_models() if m.name in ("text", "streamer")))


def drive_chat(base_url: str) -> dict[str, Any]:
    """Runs in a worker thread (see test_playground_browser for the event loop policy)."""
    from playwright.sync_api import expect

    got: dict[str, Any] = {}
    with chromium_page() as (page, errors):
        bodies: list[str] = []
        page.on("request", lambda r: bodies.append(r.post_data or "") if "/v1/chat" in r.url else None)
        page.goto(f"{base_url}/")
        expect(page.locator("#model")).to_have_attribute("data-ready", "true")
        page.select_option("#mode", "chat")
        page.fill("#max-tokens", str(MAX_TOKENS))
        page.fill("#temperature", "0")
        page.check("#continue")

        def send(text: str) -> str:
            page.fill("#prompt", text)
            page.click("#generate")
            expect(page.locator("#output")).to_have_attribute("data-state", "done")
            return page.locator("#output .generated").last.text_content() or ""

        got["first"] = send("Speak, friend.")
        got["sequence"] = page.locator("#sequence-id").inner_text()
        got["second"] = send("Whither?")
        got["stats"] = page.locator("#stats").inner_text()
        page.click("#forget")
        expect(page.locator("#sequence")).to_be_hidden()
        page.uncheck("#continue")
        page.click("#clear")
        got["plain_first"] = send("Speak, friend.")
        got["plain_second"] = send("Whither?")
        got["transcript"] = page.locator("#output").inner_text()
        got["bodies"] = bodies
        got["errors"] = errors
    return got


@pytest.mark.usefixtures("chromium")
async def test_playground_chat_mode(server: Server) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        got = await trio.to_thread.run_sync(drive_chat, str(server.http_url))
    assert got["errors"] == []

    async def reply(messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
        body = {"model": "text", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
        async with httpx.AsyncClient(base_url=str(server.http_url)) as client:
            return await client.post("/v1/chat/completions", json=body)

    def content(answer: httpx.Response) -> str:
        assert answer.status_code == 200, answer.text
        return str(answer.json()["choices"][0]["message"]["content"]) + "\n"

    speak = {"role": "user", "content": "Speak, friend."}
    whither = {"role": "user", "content": "Whither?"}
    # over a sequence: the same two turns through the API give the same text
    started = await reply([speak], sequence_start=True)
    assert got["first"] == content(started)
    follow = await reply([whither], sequence_id=started.headers["sequence-id"], sequence_end=True)
    assert got["second"] == content(follow)
    assert got["sequence"] != started.headers["sequence-id"]  # each had its own sequence
    assert re.fullmatch(r"\d+ tokens · \d+ tok/s · first token \d+ ms", got["stats"])
    # without a sequence the page resends the history
    plain = content(await reply([speak]))
    assert got["plain_first"] == plain == got["first"]
    history = [speak, {"role": "assistant", "content": plain[:-1]}, whither]
    assert got["plain_second"] == content(await reply(history))
    assert (
        got["transcript"]
        == f"user: Speak, friend.\nassistant: {plain}user: Whither?\nassistant: {got['plain_second']}"
    )
    sent = [json.loads(b) for b in got["bodies"]]
    assert [len(b["messages"]) for b in sent] == [1, 1, 1, 3]
    assert sent[0]["sequence_start"] is True and sent[1]["sequence_id"] == got["sequence"]
    assert all(b["stream"] is True for b in sent)
