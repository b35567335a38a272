"""The playground's raw OIP editor in a real Chromium, for ``accumulator`` (stateful: every
request needs a sequence): the page opens a sequence, shows it, sends its id with each
later request and ends it, as generate mode does; and at a phone's width (390 px) every
control fits (no select cut short)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from support.browser import BROWSER_TIMEOUT, chromium_page

from actorserve.models import builtin_settings as builtin_models
from actorserve.server import Server


@pytest.fixture
async def server(launch: Callable[..., Awaitable[Server]]) -> Server:
    return await launch(models=tuple(builtin_models()))


def request(value: int) -> str:
    return json.dumps({"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]})


def drive_accumulator(base_url: str, open_sequences: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    """Runs in a worker thread; ``open_sequences()`` runs on the trio thread."""
    from playwright.sync_api import expect

    got: dict[str, Any] = {}
    with chromium_page() as (page, errors):
        bodies: list[dict[str, Any]] = []
        page.on(
            "request",
            lambda r: bodies.append(json.loads(r.post_data or "")) if r.method == "POST" else None,
        )
        page.goto(f"{base_url}/")
        expect(page.locator("#model")).to_have_attribute("data-ready", "true")
        page.select_option("#model", "accumulator")
        got["mode"] = page.locator("#mode").input_value()
        got["continue"] = (page.locator("#continue").is_checked(), page.locator("#continue").is_disabled())
        got["continue_visible"] = page.locator("#continue").is_visible()
        got["hint"] = page.locator("#raw-hint").inner_text()
        # the prefilled request works as it is: the page opens the sequence
        page.click("#generate")
        expect(page.locator("#output")).to_have_attribute("data-state", "done")
        expect(page.locator("#sequence")).to_be_visible()
        got["sequence"] = page.locator("#sequence-id").inner_text()
        for value in (3, 4):
            page.fill("#raw", request(value))
            page.click("#generate")
            expect(page.locator("#output")).to_have_attribute("data-state", "done")
        got["events"] = [
            json.loads(line)
            for span in page.locator("#output .generated").all_inner_texts()
            for line in span.splitlines()
        ]
        got["sent"] = [t.strip() for t in page.locator("#output .prompt").all_inner_texts()]
        got["open_before_end"] = trio.from_thread.run(open_sequences)
        page.click("#forget")
        expect(page.locator("#sequence")).to_be_hidden()
        expect(page.locator("body")).to_have_attribute("data-ended-sequence", got["sequence"])
        got["bodies"] = bodies
        got["errors"] = errors
    return got


@pytest.mark.usefixtures("chromium")
async def test_raw_mode_opens_shows_and_ends_a_sequence_for_a_stateful_model(server: Server) -> None:
    async def open_sequences() -> int:
        return (await server.engine.describe("accumulator")).open_sequences

    with trio.fail_after(BROWSER_TIMEOUT):
        got = await trio.to_thread.run_sync(drive_accumulator, str(server.http_url), open_sequences)

    assert got["errors"] == []
    assert got["mode"] == "raw"  # it takes no text
    assert got["continue"] == (True, True) and got["continue_visible"]  # always in a sequence
    assert "Every request needs a sequence" in got["hint"]
    sequence = got["sequence"]
    assert [e["outputs"][0]["data"] for e in got["events"]] == [[0], [3], [7]]  # a running sum
    assert {e["parameters"]["sequence_id"] for e in got["events"]} == {sequence}
    assert got["sent"] == ["> INPUT [0]", "> INPUT [3]", "> INPUT [4]"]
    assert got["open_before_end"] == 1
    first, second, third, end = got["bodies"]
    assert first["parameters"] == {"sequence_start": True}
    assert second["parameters"] == third["parameters"] == {"sequence_id": sequence}
    assert end["parameters"] == {"sequence_id": sequence, "sequence_cancel": True}
    with trio.fail_after(10):
        while await open_sequences():  # noqa: ASYNC110 (the engine's count: the cancel ends the actor)
            await trio.sleep(0.01)


def measure_controls(base_url: str) -> dict[str, Any]:
    """Each control's width at 390 px against what its content needs (a select laid out
    with ``width: auto`` takes its longest option's width), and the page's scroll width."""
    from playwright.sync_api import expect

    with chromium_page(viewport={"width": 390, "height": 844}) as (page, errors):
        page.goto(f"{base_url}/")
        expect(page.locator("#model")).to_have_attribute("data-ready", "true")
        sizes = page.evaluate(
            """() => Object.fromEntries(["model", "mode"].map((id) => {
                 const select = document.getElementById(id);
                 const width = select.getBoundingClientRect().width;
                 const right = select.getBoundingClientRect().right;
                 const probe = select.cloneNode(true);
                 probe.style.width = "auto";
                 probe.style.position = "absolute";
                 probe.style.visibility = "hidden";
                 document.body.append(probe);
                 const needed = probe.getBoundingClientRect().width;
                 probe.remove();
                 return [id, {width, needed, right}];
               }))"""
        )
        sizes["page"] = page.evaluate("() => document.documentElement.scrollWidth")
        sizes["errors"] = errors
    return sizes


@pytest.mark.usefixtures("chromium")
async def test_no_select_is_clipped_at_a_phones_width(server: Server) -> None:
    with trio.fail_after(BROWSER_TIMEOUT):
        got = await trio.to_thread.run_sync(measure_controls, str(server.http_url))
    assert got.pop("errors") == []
    assert got.pop("page") <= 390  # nothing wider than the screen
    for name, size in got.items():
        assert size["width"] >= size["needed"], (name, size)
        assert size["right"] <= 390, (name, size)
