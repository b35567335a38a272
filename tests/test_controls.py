"""A request's controls (:mod:`actorserve.controls`): the one ``RequestControl`` record,
read once from the parameters ("0 means none" decided there), filled by each door's wire
module (REST, Triton gRPC, OpenAI, TorchServe: each checked here against an engine that
records what reaches it), carried across the engine link as one field, stamped with the
caller by ``OwnerStamp``, and filled by the engine for an embedded caller's request."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
import msgpack
import numpy as np
import orjson
import pytest
from grpclib.exceptions import GRPCError

from actorserve import InferenceRequest, ModelSettings
from actorserve.controls import (
    ANY_ID_LENGTH,
    NO_CONTROL,
    OWNER_PARAMETER,
    RequestControl,
    control_of,
    no_sequence_id,
    no_sequence_text,
    with_control,
)
from actorserve.engine import open_engine
from actorserve.errors import BadInput
from actorserve.ipc.failures import WireError
from actorserve.ipc.values import control_from_plain, control_to_plain, request_from_plain, request_to_plain
from actorserve.proto.inference import InferParameter, ModelInferRequest
from actorserve.settings import Settings
from actorserve.textgen import TextGeneration, TextOptions
from actorserve.transport.grpc.service import InferenceService
from actorserve.transport.openai.choices import plan_choices
from actorserve.transport.owner import OwnerStamp
from actorserve.transport.rest.wire import RequestHeaders, decode_infer_request
from actorserve.transport.torchserve.predictions import Call, Predictor
from actorserve.types import Tensor

# -- the record --------------------------------------------------------------------------


def test_a_request_without_controls_reads_as_the_shared_empty_record() -> None:
    assert RequestControl.from_parameters(None) is NO_CONTROL
    assert RequestControl.from_parameters({}) is NO_CONTROL
    assert RequestControl.from_parameters({"temperature": 0.5}) is NO_CONTROL
    # 0 and "" name no sequence, as in Triton (the one place that says so)
    assert RequestControl.from_parameters({"sequence_id": 0}) is NO_CONTROL
    assert RequestControl.from_parameters({"sequence_id": ""}) is NO_CONTROL
    assert not NO_CONTROL.stateful
    assert [no_sequence_id(v) for v in (None, 0, "", "0", 7, "a")] == [True, True, True, False, False, False]
    assert [no_sequence_text(t) for t in ("", "0", " 0", "7")] == [True, True, False, False]


def test_the_sequence_controls_become_typed_fields() -> None:
    control = RequestControl.from_parameters(
        {"sequence_id": 42, "sequence_start": "true", "sequence_end": 0, "sequence_cancel": "no"}
    )
    assert control == RequestControl(sequence_id="42", start=True)
    assert control.stateful
    assert RequestControl.from_parameters({"sequence_start": True}) == RequestControl(start=True)
    assert RequestControl.from_parameters({"sequence_id": "s", "sequence_cancel": True}).cancel
    with pytest.raises(BadInput, match="parameter 'sequence_end': expected a boolean, got 'maybe'"):
        RequestControl.from_parameters({"sequence_id": "s", "sequence_end": "maybe"})
    with pytest.raises(BadInput, match=r"parameter 'sequence_id': expected an integer or a string, got 1\.5"):
        RequestControl.from_parameters({"sequence_id": 1.5})


def test_priority_and_timeout_are_carried_when_they_are_counts_and_ignored_otherwise() -> None:
    # Triton's uint64 parameters: the server takes them (it did before) and acts on none
    assert RequestControl.from_parameters({"priority": 3, "timeout": 5000}) == RequestControl(
        priority=3, timeout=5000
    )
    for bad in (-1, True, "3", 1.5):
        assert RequestControl.from_parameters({"priority": bad, "timeout": bad}) is NO_CONTROL
    control = RequestControl.from_parameters({"sequence_id": "s", "priority": 1})
    assert (control.sequence_id, control.priority, control.timeout) == ("s", 1, None)


def test_the_id_cap_is_the_models_and_checked_apart_from_the_reading() -> None:
    long_id = RequestControl.from_parameters({"sequence_id": "x" * 300}, ANY_ID_LENGTH)
    assert long_id.checked(300) is long_id
    with pytest.raises(BadInput, match=r"300 characters, over the limit of 128 \(sequence.max_id_length\)"):
        long_id.checked(128)
    with pytest.raises(BadInput, match="only printable ASCII"):
        RequestControl.from_parameters({"sequence_id": "a\nb"}, ANY_ID_LENGTH)


def test_control_of_reads_a_request_once_and_takes_the_owner_out_of_its_parameters() -> None:
    params: dict[str, Any] = {"sequence_id": 7, OWNER_PARAMETER: "fp", "k": 1}
    request = InferenceRequest(inputs=[], parameters=params)
    control = control_of(request)
    assert control == RequestControl(sequence_id="7", owner="fp")
    assert request.control is control
    assert request.parameters == {"sequence_id": 7, "k": 1}  # the model sees what it did before
    request.parameters["sequence_id"] = 8  # read once: the record stands
    assert control_of(request) is control


def test_with_control_is_what_a_door_reads_never_the_owner_and_no_id_cap() -> None:
    request = InferenceRequest(
        inputs=[], parameters={"sequence_id": "y" * 200, "sequence_start": True, OWNER_PARAMETER: "forged"}
    )
    assert with_control(request) is request
    assert request.control == RequestControl(sequence_id="y" * 200, start=True)


# -- across the engine link ----------------------------------------------------------------


def test_the_record_crosses_the_engine_link_as_one_field() -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    control = RequestControl(
        sequence_id="s", start=True, end=True, owner="fp", priority=2, timeout=10, trace=traceparent
    )
    assert control_from_plain(control_to_plain(control)) == control
    assert control_from_plain(control_to_plain(NO_CONTROL)) is NO_CONTROL
    assert control_from_plain(None) is None
    data = np.array([1], dtype=np.int32)
    request = InferenceRequest(
        inputs=[Tensor("x", (1,), "INT32", data)], parameters={"sequence_id": "s"}, control=control
    )
    back = request_from_plain(msgpack.unpackb(msgpack.packb(request_to_plain(request))))
    assert back.control == control and back.parameters == {"sequence_id": "s"}
    unread = InferenceRequest(inputs=[], parameters={"sequence_id": "s"})
    assert request_from_plain(request_to_plain(unread)).control is None  # the engine reads it
    for bad in (
        [None, "yes", False, False, None, None, None, None],
        [None, False, False, False, None, None, None, 7],  # a trace is a traceparent's text
        ["a\nb", *control_to_plain(NO_CONTROL)[1:]],
        ["s", True],
        "s",
    ):
        with pytest.raises(WireError):
            control_from_plain(bad)


# -- the engine, for an embedded caller ------------------------------------------------------


async def test_an_embedded_callers_parameters_still_steer_its_sequence() -> None:
    settings = Settings(
        models=(ModelSettings(name="acc", implementation="actorserve.models.accumulator.AccumulatorModel"),)
    )
    async with open_engine(settings) as engine:
        data = np.array([5], dtype=np.int64)
        first = InferenceRequest(
            inputs=[Tensor("INPUT", (1,), "INT64", data)], parameters={"sequence_start": True}
        )
        response = await engine.infer(first, model="acc")
        assert first.control is not None and first.control.start
        sequence_id = response.parameters["sequence_id"]
        assert first.control.sequence_id == sequence_id == first.parameters["sequence_id"]  # minted in both
        again = InferenceRequest(
            inputs=[Tensor("INPUT", (1,), "INT64", data)],
            parameters={"sequence_id": sequence_id, "sequence_end": True},
        )
        second = await engine.infer(again, model="acc")
        assert second.outputs[0].data.tolist() == [10]


# -- each door's wire module fills it ---------------------------------------------------------


class Recorder:
    """An engine that records the control record of each request reaching it (None: the
    door filled none) and refuses it."""

    def __init__(self) -> None:
        self.seen: list[RequestControl | None] = []

    def _record(self, request: InferenceRequest) -> BadInput:
        self.seen.append(request.control)
        return BadInput("recorded")

    async def infer(self, request: InferenceRequest, **_: Any) -> Any:
        raise self._record(request)

    def infer_stream(self, request: InferenceRequest, **_: Any) -> Any:
        raise self._record(request)

    async def metadata(self, model: str, version: str | None = None) -> Any:
        return SimpleNamespace(platform="python")


def test_the_rest_door_fills_it_from_the_body_and_the_sequence_headers() -> None:
    body = orjson.dumps({"inputs": [], "parameters": {"sequence_start": True, "priority": 4}})
    headers = RequestHeaders.from_lookup({"sequence-id": "h1", "sequence-end": "true"}.get)
    request, _ = decode_infer_request(body, headers)
    assert request.control == RequestControl(sequence_id="h1", start=True, end=True, priority=4)
    plain, _ = decode_infer_request(orjson.dumps({"inputs": []}), RequestHeaders())
    assert plain.control is NO_CONTROL


async def test_the_grpc_door_fills_it_from_the_message() -> None:
    recorder = Recorder()
    service = InferenceService(recorder, Settings(), SimpleNamespace(recorder=None))  # type: ignore[arg-type]
    message = ModelInferRequest(
        model_name="m",
        parameters={
            "sequence_id": InferParameter(string_param="g1"),
            "sequence_start": InferParameter(bool_param=True),
            "priority": InferParameter(uint64_param=2),
        },
    )
    with pytest.raises(GRPCError):
        await service._infer(message, None, None)
    assert recorder.seen == [RequestControl(sequence_id="g1", start=True, priority=2)]


def test_the_openai_door_fills_it_from_the_sequence_options() -> None:
    options = TextOptions(sequence={"sequence_id": "o1", "sequence_end": True})
    [run] = plan_choices(TextGeneration(), ["hi"], options, 1)
    assert run.request.control == RequestControl(sequence_id="o1", end=True)


async def test_the_torchserve_door_fills_it_from_the_stateful_headers() -> None:
    recorder = Recorder()
    predictor = Predictor(recorder)  # type: ignore[arg-type]
    call = Call("m", None, {"body": (b"1", "")}, {"ts_request_sequence_id": "t1"})
    with pytest.raises(BadInput, match="recorded"):
        async with predictor.stream(call):
            pass
    assert recorder.seen == [RequestControl(sequence_id="t1", start=False, end=False)]


def test_the_doors_engine_stamps_the_owner_into_the_record() -> None:
    recorder = Recorder()
    request = InferenceRequest(inputs=[], parameters={OWNER_PARAMETER: "forged"}, control=NO_CONTROL)
    bound, unbound = OwnerStamp(recorder, bind=True), OwnerStamp(recorder, bind=False)  # type: ignore[arg-type]
    assert bound._stamped(request, "fp").control == RequestControl(owner="fp")
    assert OWNER_PARAMETER not in request.parameters
    assert unbound._stamped(request, "fp").control == NO_CONTROL
    # a request no door read yet: the owner goes in the parameters, for the engine to read
    raw = InferenceRequest(inputs=[], parameters={"sequence_id": "s"})
    assert bound._stamped(raw, "fp").parameters == {"sequence_id": "s", OWNER_PARAMETER: "fp"}
    assert control_of(raw) == RequestControl(sequence_id="s", owner="fp")


def test_every_control_field_has_a_link_reader() -> None:
    """A field added to RequestControl crosses the engine link with no edit of
    ipc/values.py, as long as its type is one the link reads."""
    from actorserve.ipc.values import _CONTROL_FIELD_TYPES

    for field in attrs.fields(RequestControl):
        assert str(field.type) in _CONTROL_FIELD_TYPES, (field.name, field.type)
