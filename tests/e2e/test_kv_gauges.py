"""The KV-cache gauges (issue 34): ``Model.kv_cache_usage`` of each replica, read by the
engine's gauge refresher, on ``GET /metrics`` of a real server in both process shapes:
per model version (the mean over its replicas) and the server's fullest version."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

import httpx
from e2e.conftest import TIMEOUT, Launch
from support.servers import start_server

from actorserve import InferenceRequest, InferenceResponse, Model, ModelSettings
from actorserve.engine import Engine


class Cached(Model):
    """Reports the KV usage the test sets per replica (in load order)."""

    usages: ClassVar[list[float | None]] = []
    made: ClassVar[int] = 0

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.index = Cached.made
        Cached.made += 1

    def kv_cache_usage(self) -> float | None:
        return Cached.usages[self.index]

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        return self.response(request, [])


class Broken(Model):
    def kv_cache_usage(self) -> float | None:
        raise RuntimeError("the hook broke")

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        return self.response(request, [])


def gauges(text: str) -> dict[str, str]:
    return {
        line.split()[0]: line.split()[1]
        for line in text.splitlines()
        if line.startswith(("actorserve_model_kv_cache_usage_ratio", "actorserve_kv_cache_usage_ratio"))
    }


async def test_the_kv_gauges_per_model_and_fullest(launch: Launch) -> None:
    Cached.usages, Cached.made = [0.25, 0.75, 1.5], 0
    server = await launch()
    engine = server.engine
    assert isinstance(engine, Engine) and server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as http:
        # no LLM loaded: the server's gauge is 0, no model has a series
        assert gauges((await http.get("/metrics")).text) == {"actorserve_kv_cache_usage_ratio": "0.0"}
        await engine.load(ModelSettings(name="cached", implementation=Cached, workers=2))
        await engine.load(ModelSettings(name="full", implementation=Cached))  # 1.5: clamped to 1
        await engine.load(ModelSettings(name="broken", implementation=Broken))  # logged, no series
        scraped = await http.get("/metrics")
        assert scraped.status_code == 200
        assert gauges(scraped.text) == {
            'actorserve_model_kv_cache_usage_ratio{model="cached",version="1"}': "0.5",
            'actorserve_model_kv_cache_usage_ratio{model="full",version="1"}': "1.0",
            "actorserve_kv_cache_usage_ratio": "1.0",
        }
        await engine.unload("full")
        assert gauges((await http.get("/metrics")).text) == {
            'actorserve_model_kv_cache_usage_ratio{model="cached",version="1"}': "0.5",
            'actorserve_model_kv_cache_usage_ratio{model="full",version="1"}': "0.0",
            "actorserve_kv_cache_usage_ratio": "0.5",
        }


MODEL = """
from actorserve import Model


class Cached(Model):
    def kv_cache_usage(self):
        return 0.25

    async def predict(self, request):
        return self.response(request, [])
"""


def test_the_kv_gauges_reach_metrics_from_the_engine_process(tmp_path: Path) -> None:
    folder = tmp_path / "cached"
    folder.mkdir()
    (folder / "model.py").write_text(MODEL)
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "cached", "implementation": "model.Cached"})
    )
    server = start_server("--http-port", "0", "--api-workers", "1", "--no-auth", str(tmp_path))
    try:
        url = server.wait_for(r"processes: REST listening on (http://\S+)", 60)[1]
        with httpx.Client(base_url=url, timeout=30) as http:
            expected = {
                'actorserve_model_kv_cache_usage_ratio{model="cached",version="1"}': "0.25",
                "actorserve_kv_cache_usage_ratio": "0.25",
            }
            # the engine writes its gauges every second (REFRESH_INTERVAL): bounded retries
            for _ in range(50):
                if gauges(http.get("/metrics").text) == expected:
                    break
                time.sleep(0.1)
            assert gauges(http.get("/metrics").text) == expected
    finally:
        server.stop()
