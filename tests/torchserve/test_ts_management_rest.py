"""TorchServe's management REST paths: list (paged), describe, register, scale,
set-default, unregister; errors as TorchServe's JSON."""

from __future__ import annotations

from typing import Any

import httpx

Launch = MakeArchive = Any

CONFIG = "minWorkers: 1\nbatchSize: 1\n"


async def test_register_describe_set_default_scale_unregister(make_archive: MakeArchive, launch: Launch) -> None:
    make_archive("echo", "streaming_handler.py", CONFIG, version="1.0")
    make_archive("echo2", "streaming_handler.py", CONFIG, version="2.0")
    server = await launch()
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        one = await client.post("/models", params={"url": "echo.mar"})
        two = await client.post("/models", params={"url": "echo2.mar", "model_name": "echo", "initial_workers": "1"})
        assert (one.status_code, two.status_code) == (200, 200), two.text
        assert two.json() == {"status": 'Model "echo" Version: 2.0 registered with 1 initial workers'}

        listed = (await client.get("/models")).json()
        assert listed == {"models": [{"modelName": "echo", "modelUrl": "echo"}, {"modelName": "ts_stateful", "modelUrl": "ts_stateful"}]}
        paged = (await client.get("/models", params={"limit": "1"})).json()
        assert paged == {"models": [{"modelName": "echo", "modelUrl": "echo"}], "nextPageToken": "1"}
        rest = (await client.get("/models", params={"limit": "1", "next_page_token": "1"})).json()
        assert rest == {"models": [{"modelName": "ts_stateful", "modelUrl": "ts_stateful"}]}

        every = (await client.get("/models/echo/all")).json()
        assert sorted(d["modelVersion"] for d in every) == ["1.0", "2.0"]
        assert [d["modelVersion"] for d in (await client.get("/models/echo")).json()] == ["2.0"]
        assert [d["modelVersion"] for d in (await client.get("/models/echo/1.0")).json()] == ["1.0"]

        default = await client.put("/models/echo/1.0/set-default")
        assert default.json() == {"status": 'Default version successfully updated for model "echo" to "1.0"'}
        assert [d["modelVersion"] for d in (await client.get("/models/echo")).json()] == ["1.0"]

        more = await client.put("/models/echo", params={"min_worker": "3", "synchronous": "true"})
        assert (more.status_code, more.json()) == (200, {"status": "Workers scaled to 3 for model: echo"})
        scaled = (await client.get("/models/echo/1.0")).json()[0]
        assert (scaled["minWorkers"], [w["id"] for w in scaled["workers"]]) == (3, ["1", "2", "3"])
        assert (await client.post("/predictions/echo", content=b"w")).text == "w:0w:1w:2w:done"
        fewer = await client.put("/models/echo/1.0", params={"min_worker": "1"})
        assert fewer.json() == {"status": "Workers scaled to 1 for model: echo"}
        assert len((await client.get("/models/echo/1.0")).json()[0]["workers"]) == 1
        zero = await client.put("/models/echo", params={"min_worker": "0"})
        assert (zero.status_code, zero.json()["type"]) == (400, "BadRequestException")

        gone = await client.delete("/models/echo/2.0")
        assert gone.json() == {"status": 'Model "echo" unregistered'}
        assert [d["modelVersion"] for d in (await client.get("/models/echo/all")).json()] == ["1.0"]
        await client.delete("/models/echo")
        missing = await client.get("/models/echo")
        assert (missing.status_code, missing.json()["type"]) == (404, "ModelNotFoundException")


async def test_management_errors_are_torchserve_json(launch: Launch) -> None:
    server = await launch()
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        no_url = await client.post("/models")
        assert (no_url.status_code, no_url.json()["message"]) == (400, "Parameter url is required.")
        nowhere = await client.post("/models", params={"url": "nothing.mar"})
        assert (nowhere.status_code, nowhere.json()["message"]) == (400, "model archive 'nothing.mar' not found")
        download = await client.post("/models", params={"url": "https://example.com/x.mar"})
        assert "no downloads" in download.json()["message"]
        bad_version = await client.put("/models/ts_stateful/9/set-default")
        assert (bad_version.status_code, bad_version.json()["message"]) == (404, "Model version 9 does not exist for model ts_stateful")
        wrong = await client.patch("/models/ts_stateful")
        assert wrong.status_code == 405
