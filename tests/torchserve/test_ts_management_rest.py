"""TorchServe's management REST paths: list (paged), describe, register, scale,
set-default, unregister; errors as TorchServe's JSON."""

from __future__ import annotations

from typing import Any

import httpx

Launch = MakeArchive = Any

CONFIG = "minWorkers: 1\nbatchSize: 1\n"


async def test_register_describe_set_default_scale_unregister(
    make_archive: MakeArchive, launch: Launch
) -> None:
    make_archive("echo", "streaming_handler.py", CONFIG + "handler:\n  prefix: 'one-'\n", version="1.0")
    make_archive("echo2", "streaming_handler.py", CONFIG + "handler:\n  prefix: 'two-'\n", version="2.0")
    server = await launch()
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        one = await client.post("/models", params={"url": "echo.mar"})
        two = await client.post(
            "/models", params={"url": "echo2.mar", "model_name": "echo", "initial_workers": "1"}
        )
        assert (one.status_code, two.status_code) == (200, 200), two.text
        assert two.json() == {"status": 'Model "echo" Version: 2.0 registered with 1 initial workers'}

        listed = (await client.get("/models")).json()
        assert listed == {
            "models": [
                {"modelName": "echo", "modelUrl": "echo"},
                {"modelName": "ts_stateful", "modelUrl": "ts_stateful"},
            ]
        }
        paged = (await client.get("/models", params={"limit": "1"})).json()
        assert paged == {"models": [{"modelName": "echo", "modelUrl": "echo"}], "nextPageToken": "1"}
        rest = (await client.get("/models", params={"limit": "1", "next_page_token": "1"})).json()
        assert rest == {"models": [{"modelName": "ts_stateful", "modelUrl": "ts_stateful"}]}

        every = (await client.get("/models/echo/all")).json()
        assert sorted(d["modelVersion"] for d in every) == ["1.0", "2.0"]
        assert [d["modelVersion"] for d in (await client.get("/models/echo/2.0")).json()] == ["2.0"]

        async def default() -> tuple[list[str], str]:
            described = [d["modelVersion"] for d in (await client.get("/models/echo")).json()]
            oip = (await client.get("/v2/repository/models/echo")).json()["default_version"]
            assert described == [oip]  # one default for both APIs
            return described, (await client.post("/predictions/echo", content=b"v")).text

        # registering 2.0 moved nothing: 1.0, registered first, stays the default
        assert await default() == (["1.0"], "one-v:0one-v:1one-v:2one-v:done")
        assert (await client.post("/predictions/echo/2.0", content=b"v")).text.startswith("two-v:0")
        moved = await client.put("/models/echo/2.0/set-default")
        assert moved.json() == {"status": 'Default version successfully updated for model "echo" to "2.0"'}
        assert await default() == (["2.0"], "two-v:0two-v:1two-v:2two-v:done")
        both = await client.delete("/models/echo")  # the default goes last, as in TorchServe
        refused = {
            "code": 403,
            "type": "InvalidModelVersionException",
            "message": "Cannot remove default version for model echo",
        }
        assert (both.status_code, both.json()) == (403, refused)
        assert (await client.put("/models/echo/1.0/set-default")).status_code == 200
        assert await default() == (["1.0"], "one-v:0one-v:1one-v:2one-v:done")

        more = await client.put("/models/echo", params={"min_worker": "3", "synchronous": "true"})
        assert (more.status_code, more.json()) == (200, {"status": "Workers scaled to 3 for model: echo"})
        scaled = (await client.get("/models/echo/1.0")).json()[0]
        assert (scaled["minWorkers"], [w["id"] for w in scaled["workers"]]) == (3, ["1", "2", "3"])
        assert (
            await client.post("/predictions/echo", content=b"w")
        ).text == "one-w:0one-w:1one-w:2one-w:done"
        fewer = await client.put("/models/echo/1.0", params={"min_worker": "1"})
        assert fewer.json() == {"status": "Workers scaled to 1 for model: echo, version: 1.0"}
        assert len((await client.get("/models/echo/1.0")).json()[0]["workers"]) == 1
        zero = await client.put("/models/echo", params={"min_worker": "0"})
        assert (zero.status_code, zero.json()["type"]) == (400, "BadRequestException")

        gone = await client.delete("/models/echo/2.0")
        assert gone.json() == {"status": 'Model "echo" unregistered'}
        assert [d["modelVersion"] for d in (await client.get("/models/echo/all")).json()] == ["1.0"]
        await client.delete("/models/echo")
        missing = await client.get("/models/echo")
        assert (missing.status_code, missing.json()) == (
            404,
            {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: echo"},
        )


async def test_management_errors_are_torchserve_json(launch: Launch) -> None:
    server = await launch()
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        no_url = await client.post("/models")
        assert (no_url.status_code, no_url.json()["message"]) == (400, "Parameter url is required.")
        nowhere = await client.post("/models", params={"url": "nothing.mar"})
        assert (nowhere.status_code, nowhere.json()["message"]) == (
            400,
            "model archive 'nothing.mar' not found",
        )
        download = await client.post("/models", params={"url": "https://example.com/x.mar"})
        assert "no downloads" in download.json()["message"]
        bad_version = await client.put("/models/ts_stateful/9/set-default")
        message = "Model version 9 does not exist for model ts_stateful"  # TorchServe's set-default words
        assert bad_version.json() == {
            "code": 404,
            "type": "ModelVersionNotFoundException",
            "message": message,
        }
        for method, path in [
            ("GET", "/models/ts_stateful/9"),
            ("PUT", "/models/ts_stateful/9"),
            ("DELETE", "/models/ts_stateful/9"),
        ]:
            reply = await client.request(method, path)
            message = "Model version: 9 does not exist for model: ts_stateful"
            assert reply.json() == {
                "code": 404,
                "type": "ModelVersionNotFoundException",
                "message": message,
            }, (method, path)
        for method, path in [
            ("GET", "/models/nope"),
            ("GET", "/models/nope/all"),
            ("PUT", "/models/nope"),
            ("DELETE", "/models/nope"),
        ]:
            reply = await client.request(method, path)
            assert reply.json() == {
                "code": 404,
                "type": "ModelNotFoundException",
                "message": "Model not found: nope",
            }, (method, path)
        wrong = await client.patch("/models/ts_stateful")
        assert wrong.status_code == 405
