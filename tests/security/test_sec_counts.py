"""The wire counts taken before a gRPC request is parsed (actorserve/proto/counts.py):
exact where they refuse, never fooled by data that merely looks like tags, and never
raising anything but :class:`BadInput` on garbage (the parser then says what is wrong)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actorserve.errors import BadInput
from actorserve.limits import MAX_FORM_FIELDS, MAX_INPUTS
from actorserve.proto import inference as pb
from actorserve.proto.counts import check_predictions_request, check_request_counts
from actorserve.proto.torchserve.org.pytorch.serve.grpc.inference import PredictionsRequest


def _request(elements: int, inputs: int = 1) -> bytes:
    tensor = pb.ModelInferRequestInferInputTensor(
        name="x",
        datatype="BYTES",
        shape=[elements],
        contents=pb.InferTensorContents(bytes_contents=[b""] * elements),
    )
    return bytes(pb.ModelInferRequest(model_name="m", inputs=[tensor] * inputs))


def test_bytes_elements_are_counted_exactly_across_inputs() -> None:
    check_request_counts(_request(50, inputs=2), limit=100)
    with pytest.raises(BadInput, match="more than 100 BYTES elements"):
        check_request_counts(_request(51, inputs=2), limit=100)


def test_tag_bytes_inside_data_are_not_elements() -> None:
    """0x42 is "B": a raw tensor full of it is far over the cheap bound, and passes."""
    message = pb.ModelInferRequest(
        model_name="m",
        inputs=[pb.ModelInferRequestInferInputTensor(name="x", datatype="UINT8", shape=[3000])],
        raw_input_contents=[b"B" * 3000],
    )
    check_request_counts(bytes(message), limit=10)


def test_inputs_and_outputs_are_counted() -> None:
    outputs = [pb.ModelInferRequestInferRequestedOutputTensor(name="y")] * (MAX_INPUTS + 1)
    check_request_counts(_request(0, inputs=MAX_INPUTS))
    with pytest.raises(BadInput, match="MAX_INPUTS"):
        check_request_counts(_request(0, inputs=MAX_INPUTS + 1))
    with pytest.raises(BadInput, match="requested outputs"):
        check_request_counts(bytes(pb.ModelInferRequest(model_name="m", outputs=outputs)))


def test_prediction_fields_are_counted() -> None:
    check_predictions_request(
        bytes(PredictionsRequest(model_name="m", input={f"f{i}": b"" for i in range(MAX_FORM_FIELDS)}))
    )
    with pytest.raises(BadInput, match="MAX_FORM_FIELDS"):
        check_predictions_request(
            bytes(
                PredictionsRequest(model_name="m", input={f"f{i}": b"" for i in range(MAX_FORM_FIELDS + 1)})
            )
        )


@given(st.binary(max_size=300))
def test_garbage_raises_nothing_but_bad_input(data: bytes) -> None:
    for check in (lambda d: check_request_counts(d, limit=2), check_predictions_request):
        try:
            check(data)
        except BadInput:
            pass
