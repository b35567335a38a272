"""Archives made by the real torch-model-archiver, served unchanged: a BaseHandler
subclass with an eager model (registered at run time), a module-level handle() that
streams with send_intermediate_predict_response, model-config.yaml mapped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from actorserve.engine.repository import ModelRepository
from actorserve.settings import SettingsError
from actorserve.torchserve import Overrides, archive_settings
from actorserve.torchserve_envelope import SEQUENCE_PLATFORM

Launch = MakeArchive = Any

STREAM_CONFIG = "batchSize: 2\nmaxBatchDelay: 20\nminWorkers: 1\nhandler:\n  prefix: 'p-'\n"


def test_model_config_keys_map_to_settings(make_archive: MakeArchive) -> None:
    config = (
        "batchSize: 8\nmaxBatchDelay: 25\nminWorkers: 2\nmaxWorkers: 3\nresponseTimeout: 30\n"
        "sequenceBatching: true\ncontinuousBatching: true\nsequenceMaxIdleMSec: 5000\n"
        "sequenceTimeoutMSec: 60000\nmaxSequenceJobQueueSize: 7\nmaxNumSequence: 9\n"
        "handler:\n  anything: [1, 2]\n"
    )
    settings = archive_settings(make_archive("cfg", "streaming_handler.py", config, version="2.5"))
    assert (settings.name, settings.version, settings.platform) == ("cfg", "2.5", SEQUENCE_PLATFORM)
    assert (settings.max_batch_size, settings.max_batch_time, settings.workers) == (8, 0.025, 2)
    sequence = settings.sequence
    assert (
        sequence.idle_timeout_ms,
        sequence.max_duration_ms,
        sequence.max_queue,
        sequence.max_sequences,
    ) == (5000, 60000, 7, 9)
    assert settings.parameters["model_yaml_config"]["handler"] == {"anything": [1, 2]}
    assert settings.parameters["response_timeout_s"] == 30
    assert settings.parameters["max_workers"] == 3
    overridden = archive_settings(
        make_archive("cfg", "streaming_handler.py", config), Overrides(name="other", batch_size=1, workers=1)
    )
    assert (overridden.name, overridden.max_batch_size, overridden.max_batch_time, overridden.workers) == (
        "other",
        1,
        0.0,
        1,
    )


def test_a_broken_archive_is_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / "bad.mar").write_bytes(b"not a zip")
    with pytest.raises(SettingsError, match=r"bad.mar: not a readable .mar archive"):
        archive_settings(tmp_path / "bad.mar")
    with pytest.raises(SettingsError, match=r"no such model archive"):
        archive_settings(tmp_path / "missing.mar")


async def test_a_base_handler_archive_registered_at_run_time(
    make_archive: MakeArchive, doubler_weights: Path, launch: Launch
) -> None:
    make_archive("doubler", "doubler_handler.py", model_file="doubler_model.py", serialized=doubler_weights)
    server = await launch()
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        reply = await client.post(
            "/models", params={"url": "doubler.mar", "batch_size": "4", "max_batch_delay": "10"}
        )
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"status": 'Model "doubler" Version: 1.0 registered with 1 initial workers'}
        answer = await client.post("/predictions/doubler", json=[1.5, -2])
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"doubled": [3.0, -4.0]}
        assert answer.headers["x-batch-size"] == "1"
        described = (await client.get("/models/doubler")).json()
        assert [(d["modelName"], d["modelVersion"], d["batchSize"], d["minWorkers"]) for d in described] == [
            ("doubler", "1.0", 4, 1)
        ]


async def test_intermediate_responses_stream_as_chunks(make_archive: MakeArchive, launch: Launch) -> None:
    folder = make_archive("streaming", "streaming_handler.py", STREAM_CONFIG, fmt="no-archive")
    server = await launch(archive_settings(folder))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        chunks = []
        async with client.stream("POST", "/predictions/streaming", content=b"hi") as stream:
            assert stream.status_code == 200
            async for chunk in stream.aiter_raw():
                chunks.append(chunk)
        assert chunks == [b"p-hi:0", b"p-hi:1", b"p-hi:2", b"p-hi:done"]
        whole = await client.post("/predictions/streaming", content=b"yo")
        assert whole.text == "p-yo:0p-yo:1p-yo:2p-yo:done"


async def test_a_handler_that_fails_is_answered_as_torchserve_does(tmp_path: Path, launch: Launch) -> None:
    folder = tmp_path / "broken"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": "broken", "handler": "h.py"}})
    )
    (folder / "h.py").write_text(
        "def handle(data, context):\n"
        "    if data is None:\n        return None\n"
        "    if data[0]['body'] == b'short':\n        return []\n"
        "    raise ValueError('no')\n"
    )
    server = await launch(archive_settings(folder))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        failed = await client.post("/predictions/broken", content=b"x")
        assert failed.status_code == 503
        assert failed.json() == {
            "code": 503,
            "type": "ServiceUnavailableException",
            "message": "Prediction failed",
        }
        short = await client.post("/predictions/broken", content=b"short")
        assert (short.status_code, short.json()["message"]) == (503, "number of batch response mismatched")


async def test_the_model_store_is_a_repository(
    make_archive: MakeArchive, store: Path, launch: Launch
) -> None:
    make_archive("streaming", "streaming_handler.py", STREAM_CONFIG)
    make_archive("foldered", "streaming_handler.py", fmt="no-archive")
    assert sorted(m.name for m in ModelRepository((store,)).discover()) == ["foldered", "streaming"]
    server = await launch()
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        loaded = await client.post("/v2/repository/models/streaming/load")  # OIP's load, by manifest name
        assert loaded.status_code == 200, loaded.text
        assert (await client.post("/predictions/streaming", content=b"s")).text == "p-s:0p-s:1p-s:2p-s:done"
