"""TorchServe's REST inference API: /ping, /predictions with the stateful headers (the
built-in stateful example), chunked streaming, TorchServe's errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

from actorserve.torchserve import archive_settings

SEQ_ID = "ts_request_sequence_id"
SEQ_START = "ts_request_sequence_start"
SEQ_END = "ts_request_sequence_end"


async def test_ping_says_healthy(client: httpx.AsyncClient) -> None:
    reply = await client.get("/ping")
    assert reply.status_code == 200
    assert reply.json() == {"status": "Healthy"}


async def test_explanations_are_501_with_a_clear_message(client: httpx.AsyncClient) -> None:
    reply = await client.post("/explanations/ts_stateful", content=b"1")
    assert reply.status_code == 501
    assert reply.json()["code"] == 501
    assert "explanations are not supported" in reply.json()["message"]


async def test_unknown_model_is_404_as_torchserve_says(client: httpx.AsyncClient) -> None:
    reply = await client.post("/predictions/nope", content=b"1")
    assert reply.status_code == 404
    assert reply.json() == {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: nope"}
    version = await client.post("/predictions/ts_stateful/9", content=b"1")
    message = "Model version: 9 does not exist for model: ts_stateful"
    assert (version.status_code, version.json()) == (
        404,
        {"code": 404, "type": "ModelVersionNotFoundException", "message": message},
    )


async def test_a_sequence_through_the_stateful_headers(client: httpx.AsyncClient) -> None:
    # no id on a sequence-batching model: the server starts one and returns its id
    first = await client.post("/predictions/ts_stateful", content=b"2")
    assert first.status_code == 200, first.text
    assert first.text == "2"
    sequence_id = first.headers[SEQ_ID]
    assert sequence_id.startswith("ts-seq-")
    # even inputs answer once with the running sum
    second = await client.post("/predictions/ts_stateful/1", content=b"4", headers={SEQ_ID: sequence_id})
    assert (second.status_code, second.text, second.headers[SEQ_ID]) == (200, "6", sequence_id)
    assert SEQ_END not in second.headers
    # 0 ends it: the response carries the end header
    last = await client.put("/predictions/ts_stateful", content=b"0", headers={SEQ_ID: sequence_id})
    assert (last.status_code, last.text, last.headers[SEQ_END]) == (200, "6", sequence_id)


async def test_an_odd_input_streams_until_a_later_request_ends_the_sequence(
    client: httpx.AsyncClient,
) -> None:
    start = await client.post(
        "/predictions/ts_stateful", content=b"1", headers={SEQ_ID: "s1", SEQ_START: "true"}
    )
    assert (start.text, start.headers[SEQ_ID]) == ("1", "s1")
    chunks: list[bytes] = []
    async with client.stream(
        "POST", "/predictions/ts_stateful", content=b"3", headers={SEQ_ID: "s1"}
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["transfer-encoding"] == "chunked"
        async for chunk in stream.aiter_raw():
            chunks.append(chunk)
            if len(chunks) == 2:  # the stream runs: a later request of the sequence ends it
                end = await client.post("/predictions/ts_stateful", content=b"0", headers={SEQ_ID: "s1"})
                assert (end.text, end.headers[SEQ_END]) == ("4", "s1")
    assert set(chunks) == {b"4"}
    assert len(chunks) >= 3  # its last chunk came with the end
    # the sequence is over: the same id without a start is closed by the handler
    again = await client.post("/predictions/ts_stateful", content=b"5", headers={SEQ_ID: "s1"})
    assert (again.status_code, again.text, again.headers[SEQ_END]) == (200, "5", "s1")


async def test_cancel_stops_the_streams_and_keeps_the_sequence(client: httpx.AsyncClient) -> None:
    await client.post("/predictions/ts_stateful", content=b"1", headers={SEQ_ID: "s2", SEQ_START: "true"})
    chunks: list[bytes] = []
    async with client.stream(
        "POST", "/predictions/ts_stateful", content=b"5", headers={SEQ_ID: "s2"}
    ) as stream:
        async for chunk in stream.aiter_raw():
            chunks.append(chunk)
            if len(chunks) == 1:
                cancel = await client.post("/predictions/ts_stateful", content=b"-1", headers={SEQ_ID: "s2"})
                assert (cancel.status_code, cancel.text) == (200, "-1")
                assert SEQ_END not in cancel.headers
    assert set(chunks) == {b"6"}
    more = await client.post("/predictions/ts_stateful", content=b"2", headers={SEQ_ID: "s2"})
    assert more.text == "8"


async def test_forms_split_into_inputs_as_torchserve_does(client: httpx.AsyncClient) -> None:
    # the handler reads "data" (or "body"): a multipart file part named data, a form field
    files = {"data": ("n.txt", b"2", "text/plain")}
    first = await client.post(
        "/predictions/ts_stateful", files=files, headers={SEQ_ID: "f", SEQ_START: "true"}
    )
    assert (first.status_code, first.text) == (200, "2")
    second = await client.post("/predictions/ts_stateful", data={"data": "4"}, headers={SEQ_ID: "f"})
    assert (second.status_code, second.text) == (200, "6")
    charset = await client.post(
        "/predictions/ts_stateful",
        content=b'{"input": 2}',
        headers={SEQ_ID: "f", "content-type": "application/json; charset=utf-8"},
    )
    assert charset.text == "8"
    broken = await client.post(
        "/predictions/ts_stateful", content=b"x", headers={"content-type": "multipart/form-data"}
    )
    assert (broken.status_code, broken.json()["message"]) == (400, "multipart/form-data without a boundary")


async def test_a_start_for_an_open_sequence_restarts_it_in_the_handler(client: httpx.AsyncClient) -> None:
    first = await client.post(
        "/predictions/ts_stateful", content=b"8", headers={SEQ_ID: "s3", SEQ_START: "true"}
    )
    again = await client.post(
        "/predictions/ts_stateful", content=b"2", headers={SEQ_ID: "s3", SEQ_START: "true"}
    )
    assert (first.status_code, first.text, again.status_code, again.text) == (200, "8", 200, "2")


async def test_a_json_body_reaches_the_handler_parsed(client: httpx.AsyncClient) -> None:
    first = await client.post("/predictions/ts_stateful", json={"input": 4})
    assert first.text == "4"
    second = await client.post(
        "/predictions/ts_stateful", json={"input": 2}, headers={SEQ_ID: first.headers[SEQ_ID]}
    )
    assert second.text == "6"


async def settled(server: Any, model: str, **expected: int) -> None:
    """Wait until the server's loop has nothing left to do and ``model``'s statistics
    show ``expected`` (bounded: the requests were sent; they only need to arrive)."""
    for _ in range(200):
        await trio.testing.wait_all_tasks_blocked(0.01)
        statistics = await server.engine.statistics(model)
        if all(getattr(statistics, name) == value for name, value in expected.items()):
            return
    raise AssertionError(f"{model}: never {expected}, last {statistics}")


async def test_full_queues_are_503_as_torchserve_says(tmp_path: Path, launch: Any) -> None:
    folder = tmp_path / "slow"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": "slow", "handler": "slow.py"}})
    )
    (folder / "model-config.yaml").write_text(
        "sequenceBatching: true\nmaxNumSequence: 1\nmaxSequenceJobQueueSize: 1\n"
    )
    (folder / "slow.py").write_text(
        "import time\n"
        "def handle(data, context):\n"
        "    if data is None:\n        return None\n"
        "    time.sleep(float(data[0]['body']))\n"
        "    return ['ok']\n"
    )
    server = await launch(archive_settings(folder))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        replies: list[httpx.Response] = []

        async def post(delay: bytes) -> None:
            replies.append(await client.post("/predictions/slow", content=delay, headers={SEQ_ID: "busy"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, b"0.5")  # runs
            await settled(server, "slow", inflight=1)
            nursery.start_soon(post, b"0")  # waits in the sequence's queue (size 1)
            await settled(server, "slow", inflight=2, queued=1)
            full = await client.post("/predictions/slow", content=b"0", headers={SEQ_ID: "busy"})
            assert full.status_code == 503
            assert full.json() == {
                "code": 503,
                "type": "ServiceUnavailableException",
                "message": "sequence 'busy' already has 1 requests queued (max_queue)",
            }
        assert [r.text for r in replies] == ["ok", "ok"]
        other = await client.post("/predictions/slow", content=b"0", headers={SEQ_ID: "another"})
        assert other.status_code == 503  # maxNumSequence: 1, and "busy" is still open
        assert other.json()["type"] == "ServiceUnavailableException"


async def test_a_handler_past_its_response_timeout_is_restarted(tmp_path: Path, launch: Any) -> None:
    folder = tmp_path / "stuck"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": "stuck", "handler": "h.py"}})
    )
    (folder / "model-config.yaml").write_text("responseTimeout: 1\n")
    (folder / "h.py").write_text(
        "import time\n"
        "calls = []\n"
        "def handle(data, context):\n"
        "    if data is None:\n        calls.append('init')\n        return None\n"
        "    time.sleep(float(data[0]['body']))\n"
        "    return [str(len(calls))]\n"
    )
    server = await launch(archive_settings(folder))
    async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as client:
        stuck = await client.post("/predictions/stuck", content=b"3")
        assert stuck.status_code == 500
        assert stuck.json()["message"].startswith("Worker died. (no response within responseTimeout 1 s")
        fine = await client.post("/predictions/stuck", content=b"0")
        assert (fine.status_code, fine.text) == (200, "1")  # a fresh handler (its module re-imported)
