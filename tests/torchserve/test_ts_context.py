"""The handler context's wire pieces against the real ``ts`` package, and a TorchServe
model reached through the Open Inference Protocol."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
from ts.context import Context as TsContext
from ts.context import RequestProcessor as TsRequestProcessor
from ts.protocol.otf_message_handler import create_predict_response

import actorserve
from actorserve.codecs import tensor_from_numpy
from actorserve.models import builtin_settings
from actorserve.torchserve import archive_settings
from actorserve.torchserve.context import (
    Context,
    IntermediateSink,
    RequestProcessor,
    decode_predict_frame,
    encode_predict_frame,
    send_intermediate_predict_response,
)
from actorserve.torchserve_envelope import HeaderNames, answer, make_request
from actorserve.types import InferenceRequest


def contexts() -> tuple[TsContext, Context, list[object]]:
    theirs = TsContext("m", "/tmp", {}, 2, None, "0.12")
    sent: list[object] = []
    ours = Context("m", "/tmp", {}, 2, {}, HeaderNames(), IntermediateSink(sent.append))
    for context, processor in ((theirs, TsRequestProcessor), (ours, RequestProcessor)):
        context.request_ids = {0: "a", 1: "b"}
        context.request_processor = [processor({"h": "1"}), processor({})]
        context.set_response_header(0, "x-one", "1")
        context.set_response_content_type(1, "application/json")
        context.set_response_status(201, "made", idx=1)
    return theirs, ours, sent


def test_our_frame_is_byte_for_byte_ts_frame_and_decodes() -> None:
    theirs, ours, _ = contexts()
    ret = ["text", {"k": [1, 2]}]
    expected = create_predict_response(
        ret, theirs.request_ids, "Intermediate", 200, theirs, ts_stream_next=True
    )
    frame = encode_predict_frame(ret, ours.request_ids or {}, "Intermediate", 200, ours)
    assert frame == bytes(expected)
    decoded = decode_predict_frame(frame)
    assert (decoded.code, decoded.message) == (200, "Intermediate")
    assert decoded.responses["a"] == (b"text", "", 200, "", {"x-one": "1", "ts_stream_next": "true"})
    body, content_type, status, phrase, headers = decoded.responses["b"]
    assert (body, content_type, status, phrase) == (
        b'{\n  "k": [\n    1,\n    2\n  ]\n}',
        "application/json",
        201,
        "made",
    )
    assert headers == {"content-type": "application/json", "ts_stream_next": "true"}


def test_send_intermediate_without_the_ts_package_reaches_the_sink() -> None:
    _, ours, sent = contexts()
    send_intermediate_predict_response(["x", "y"], {0: "a", 1: "b"}, "Intermediate", 200, ours)
    (event,) = sent
    assert {k: v[0] for k, v in event.responses.items()} == {"a": b"x", "b": b"y"}  # type: ignore[attr-defined]


async def test_a_torchserve_model_through_oip() -> None:
    (stateful,) = [m for m in builtin_settings() if m.name == "ts_stateful"]

    def body(value: bytes, **parameters: object) -> InferenceRequest:
        data = np.empty(1, dtype=object)
        data[0] = value
        return InferenceRequest([tensor_from_numpy("body", data, "BYTES")], parameters=dict(parameters))

    async with actorserve.open_engine([stateful]) as engine:
        first = await engine.infer(body(b"5", sequence_id="oip", sequence_start=True), model="ts_stateful")
        assert first.outputs[0].data.tolist() == [b"5"]
        # as a JSON string: OIP gRPC's InferParameter has no map
        assert json.loads(first.parameters["ts_headers"]) == {"ts_request_sequence_id": "oip"}
        second = await engine.infer(body(b"2", sequence_id="oip"), model="ts_stateful")
        assert second.outputs[0].data.tolist() == [b"7"]


async def test_a_slow_reader_gets_every_intermediate_response_once_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": "many", "handler": "many.py"}})
    )
    (folder / "many.py").write_text(
        "from actorserve.torchserve import send_intermediate_predict_response\n"
        "def handle(data, context):\n"
        "    if data is None:\n        return None\n"
        "    for k in range(200):\n"
        "        send_intermediate_predict_response([str(k)] * len(data), context.request_ids, 'ok', 200, context)\n"
        "    return ['done'] * len(data)\n"
    )
    (folder / "model-config.yaml").write_text("batchSize: 2\nmaxBatchDelay: 200\n")
    expected = [str(k).encode() for k in range(200)] + [b"done"]
    async with actorserve.open_engine([archive_settings(folder)]) as engine:
        async with (
            engine.infer_stream(make_request({"body": (b"x", "")}, {}, model="many")) as slow,
            engine.infer_stream(make_request({"body": (b"y", "")}, {}, model="many")) as fast,
        ):
            # one handler call serves both; the slow reader's buffer (64) fills and it sits
            # out steps while the fast one's are handed out: its outputs wait for it
            assert [answer(r).body async for r in fast] == expected
            assert [answer(r).body async for r in slow] == expected
        assert (await engine.statistics("many")).inflight == 0


async def test_unloading_ends_the_handler_thread_even_mid_stream(tmp_path: Path) -> None:
    folder = tmp_path / "endless"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {"modelName": "endless", "handler": "h.py"}})
    )
    (folder / "h.py").write_text(
        "from actorserve.torchserve import send_intermediate_predict_response\n"
        "def handle(data, context):\n"
        "    if data is None:\n        return None\n"
        "    while True:\n"
        "        send_intermediate_predict_response(['x'] * len(data), context.request_ids, 'ok', 200, context)\n"
    )
    threads = lambda: [t for t in threading.enumerate() if t.name == "torchserve-endless"]  # noqa: E731
    async with actorserve.open_engine([archive_settings(folder)]) as engine:
        assert len(threads()) == 1
        async with engine.infer_stream(make_request({"body": (b"x", "")}, {}, model="endless")) as responses:
            assert answer(await responses.__anext__()).body == b"x"
            await engine.unload("endless", grace=0)
    for thread in threads():
        thread.join(5)
    assert threads() == []
