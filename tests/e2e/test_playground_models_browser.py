"""The playground offers each model exactly what it takes, read from its metadata: a
prompt box and typed fields of its declared parameters for a text model (``text``,
``streamer``), a raw OIP request editor with a live view of the stream for a model that
takes no text (``countdown``, the tests' own). Real Chromium, real server."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from support.browser import BROWSER_TIMEOUT, CHROMIUM, FLAGS
from support.countdown import countdown_settings

from actorserve.models import builtin_settings as builtin_models
from actorserve.server.composition import Server


@pytest.fixture
async def server(launch: Callable[..., Awaitable[Server]]) -> Server:
    models = tuple(m for m in builtin_models() if m.name in ("text", "streamer"))
    return await launch(models=(*models, countdown_settings()))


def fields(page: Any) -> dict[str, str]:
    """The parameter fields shown: name -> input type."""
    shown = page.locator("#params input[data-param]:visible")
    return {i.get_attribute("data-param"): i.get_attribute("type") for i in shown.all()}


def modes(page: Any) -> list[str]:
    return page.locator("#mode option:not([disabled])").evaluate_all("(os) => os.map((o) => o.value)")


def drive(base_url: str) -> dict[str, Any]:
    """Runs in a worker thread (see test_playground_browser for the event loop policy)."""
    from playwright.sync_api import expect, sync_playwright

    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    got: dict[str, Any] = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
            try:
                page = browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                urls: list[str] = []
                page.on("request", lambda r: urls.append(r.url) if "generate_stream" in r.url else None)
                bodies: list[str] = []
                page.on(
                    "request", lambda r: bodies.append(r.post_data or "") if "infer_stream" in r.url else None
                )
                page.goto(f"{base_url}/")
                expect(page.locator("#model")).to_have_attribute("data-ready", "true")
                got["options"] = page.locator("#model option").all_inner_texts()
                got["text_fields"], got["text_modes"] = fields(page), modes(page)

                # streamer: its own parameters, nothing it did not declare
                page.select_option("#model", "streamer")
                got["streamer_fields"], got["streamer_modes"] = fields(page), modes(page)
                page.fill("#max-tokens", "3")
                page.fill("#prompt", "hi")
                page.click("#generate")
                expect(page.locator("#output")).to_have_attribute("data-state", "done")
                got["streamer_text"] = page.locator("#output .generated").last.text_content()
                page.fill("#param-delay", "0.001")
                page.check("#param-usage")
                page.click("#generate")
                expect(page.locator("#output")).to_have_attribute("data-state", "done")
                got["streamer_urls"] = urls
                got["streamer_error"] = page.locator("#error").is_visible()

                # countdown: no text input, so a raw request, streamed as it comes
                page.select_option("#model", "countdown")
                got["countdown_modes"], got["mode"] = modes(page), page.locator("#mode").input_value()
                got["prompt_visible"] = page.locator("#prompt").is_visible()
                got["template"] = json.loads(page.locator("#raw").input_value())
                got["hint"] = page.locator("#raw-hint").inner_text()
                request = {
                    "inputs": [{"name": "start", "datatype": "INT64", "shape": [1], "data": [10]}],
                    "parameters": {"count": 4, "step": 3},
                }
                page.fill("#raw", json.dumps(request))
                page.click("#generate")
                expect(page.locator("#output")).to_have_attribute("data-state", "done")
                got["events"] = page.locator("#output").get_attribute("data-events")
                got["raw_output"] = page.locator("#output").inner_text()
                got["raw_stats"] = page.locator("#stats").inner_text()
                request["parameters"] = {"speed": 2}
                page.fill("#raw", json.dumps(request))
                page.press("#raw", "Control+Enter")
                expect(page.locator("#output")).to_have_attribute("data-state", "error")
                got["raw_error"] = page.locator("#error").inner_text()
                got["bodies"] = [json.loads(b) for b in bodies]
                got["errors"] = errors
            finally:
                browser.close()
    finally:
        asyncio.set_event_loop_policy(None)
    return got


@pytest.mark.usefixtures("chromium")
async def test_playground_offers_what_each_model_takes(server: Server) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        got = await trio.to_thread.run_sync(drive, str(server.http_url))
    assert got["errors"] == []
    assert got["options"] == ["countdown (raw OIP)", "streamer", "text"]  # the index's order
    # text: its text-generation parameters first (typed), then its other declared ones
    assert got["text_fields"] == {
        "max_tokens": "number",
        "temperature": "number",
        "top_p": "number",
        "seed": "number",
        "stop": "text",
        "top_k": "text",
        "usage": "checkbox",
    }
    assert got["text_modes"] == ["generate", "chat", "raw"]
    # streamer: n_tokens bounds its tokens; no temperature; no chat template
    assert got["streamer_fields"] == {"n_tokens": "number", "delay": "text", "usage": "checkbox"}
    assert got["streamer_modes"] == ["generate", "raw"]
    assert got["streamer_text"] == "hi:0hi:1hi:2"
    first, second = got["streamer_urls"]
    assert first.endswith("/v2/models/streamer/generate_stream?text_input=hi&n_tokens=3")
    assert second.endswith("?text_input=hi&n_tokens=3&delay=0.001&usage=true")
    assert got["streamer_error"] is False
    # countdown: raw only, a template from its metadata, its declared parameters named
    assert (got["countdown_modes"], got["mode"], got["prompt_visible"]) == (["raw"], "raw", False)
    assert got["template"] == {
        "inputs": [{"name": "start", "datatype": "INT64", "shape": [1], "data": [0]}],
        "parameters": {},
    }
    assert got["hint"] == "Parameters this model reads: count, step."
    assert got["events"] == "4"
    assert re.match(r"4 events · ", got["raw_stats"])
    values = [json.loads(line)["outputs"][0]["data"] for line in got["raw_output"].splitlines()]
    assert values == [[10], [7], [4], [1]]
    assert got["raw_error"] == (
        "HTTP 400: model 'countdown' has no parameter 'speed'; its parameters are: count, step"
    )
    assert [b["parameters"] for b in got["bodies"]] == [{"count": 4, "step": 3}, {"speed": 2}]
