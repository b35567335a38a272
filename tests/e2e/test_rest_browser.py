"""A real browser (Chromium through Playwright) reading streams: ``EventSource`` on the
GET ``generate_stream`` (closing on ``event: end``) and ``fetch`` on the POST
``infer_stream``. Playwright's synchronous API runs in a child process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from support.browser import CHROMIUM, FLAGS

from actorserve.server.composition import Server

EVENT_SOURCE = """
url => new Promise((resolve, reject) => {
  const got = [];
  const source = new EventSource(url);
  source.onmessage = e => got.push(JSON.parse(e.data).text_output);
  source.addEventListener("end", () => { source.close(); resolve(got); });
  source.onerror = () => { source.close(); reject(new Error("stream failed after " + got.length)); };
})
"""

FETCH_STREAM = """
async ([url, body]) => {
  const reply = await fetch(url, {method: "POST", body: JSON.stringify(body),
                                  headers: {"Content-Type": "application/json"}});
  const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  for (;;) { const {value, done} = await reader.read(); if (done) break; text += value; }
  return {status: reply.status, type: reply.headers.get("content-type"),
          tokens: text.split("\\n\\n").filter(Boolean).map(f => JSON.parse(f.slice(6)).outputs[0].data[0])};
}
"""


def in_browser(base_url: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(f"{base_url}/v2/health/live")  # same origin as the streams
            events = page.evaluate(
                EVENT_SOURCE, "/v2/models/streamer/generate_stream?text_input=web&n_tokens=3"
            )
            body = {
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["f"]}],
                "parameters": {"n_tokens": 2},
            }
            fetched = page.evaluate(FETCH_STREAM, ["/v2/models/streamer/infer_stream", body])
        finally:
            browser.close()
    return {"events": events, "fetched": fetched}


@pytest.mark.usefixtures("chromium")
async def test_browser_event_source_and_fetch(server: Server) -> None:
    # Playwright runs in its own process: its sync API needs a plain asyncio loop, and
    # trio-asyncio (imported by the gRPC transport) changes asyncio's loop policy here.
    code = (
        f"import json, sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]; "
        f"from test_rest_browser import in_browser; print(json.dumps(in_browser({str(server.http_url)!r})))"
    )
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-c", code], capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    got = json.loads(done.stdout)
    assert got["events"] == ["web:0", "web:1", "web:2"]
    assert got["fetched"] == {"status": 200, "type": "text/event-stream", "tokens": ["f:0", "f:1"]}
