"""actorserve.proto.convert: protobuf messages <-> actorserve domain types."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from actorserve.codecs import tensor_from_numpy
from actorserve.errors import BadInput
from actorserve.proto import inference as bp
from actorserve.proto.convert import (
    params_from_pb,
    params_to_pb,
    request_from_pb,
    request_to_pb,
    response_from_pb,
    response_to_pb,
    tensor_contents_from_pb,
)
from actorserve.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]
SHAPES = [(1,), (2, 3)]

_NP = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Values that exercise the edges of each datatype (extremes, signs, empty bytes)."""
    n = math.prod(shape)
    if datatype == "BYTES":
        pool = [b"", b"\x00\xff\xfe", "héllo".encode(), b"x" * 300, b"abc", b"\n"]
        out = np.empty(n, dtype=object)
        out[:] = [pool[i % len(pool)] for i in range(n)]
        return out.reshape(shape)
    dtype = np.dtype(_NP[datatype])
    if datatype == "BOOL":
        values: list[Any] = [i % 2 == 0 for i in range(n)]
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        pool_i = [int(info.max), int(info.min), 0, 1, int(info.max) - 1, 7]
        values = [pool_i[i % len(pool_i)] for i in range(n)]
    else:
        info_f = np.finfo(dtype)
        pool_f = [float(info_f.max), -0.0, 1.5, -float("inf"), float(info_f.tiny), -3.25]
        values = [pool_f[i % len(pool_f)] for i in range(n)]
    return np.array(values, dtype=dtype).reshape(shape)


def make_tensor(name: str, datatype: str, shape: tuple[int, ...], **params: Any) -> Tensor:
    return tensor_from_numpy(name, sample(datatype, shape), datatype, params)


def through_the_wire(msg: Any) -> Any:
    """Serialise and parse again, as a transport would."""
    return type(msg).parse(bytes(msg))


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_request_round_trip(datatype: str, shape: tuple[int, ...], raw: bool) -> None:
    request = InferenceRequest(
        inputs=[make_tensor("x", datatype, shape, scale=2), make_tensor("y", "INT32", (2,))],
        id="r1",
        parameters={"sequence_id": 42, "sequence_start": True},
        outputs=[RequestedOutput("out", {"top_k": 3}), RequestedOutput("other")],
        model_name="m",
        model_version="1",
    )
    msg = request_to_pb(request, raw=raw)
    if raw or datatype == "FP16":  # FP16 has no typed field: the whole message goes raw
        assert len(msg.raw_input_contents) == 2
        assert all(entry.contents is None for entry in msg.inputs)
    else:
        assert msg.raw_input_contents == []
        assert all(entry.contents is not None for entry in msg.inputs)
    decoded = request_from_pb(through_the_wire(msg))
    assert decoded == request
    assert decoded.inputs[0].data.dtype == request.inputs[0].data.dtype
    assert decoded.inputs[0].data.shape == shape


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_response_round_trip(datatype: str, shape: tuple[int, ...], raw: bool) -> None:
    response = InferenceResponse(
        model_name="m",
        outputs=[make_tensor("out", datatype, shape, unit="s"), make_tensor("n", "FP64", (1,))],
        model_version="2",
        id="r1",
        parameters={"sequence_end": False, "ratio": 0.5},
    )
    msg = response_to_pb(response, raw=raw)
    assert bool(msg.raw_output_contents) == (raw or datatype == "FP16")
    decoded = response_from_pb(through_the_wire(msg))
    assert decoded == response
    assert decoded.outputs[0].data.dtype == response.outputs[0].data.dtype


@pytest.mark.parametrize("datatype", DATATYPES)
def test_response_is_readable_by_tritonclient(datatype: str) -> None:
    expected = sample(datatype, (2, 3))
    response = InferenceResponse(
        model_name="m", outputs=[tensor_from_numpy("out", expected, datatype)], id="r"
    )
    theirs = service_pb2.ModelInferResponse.FromString(bytes(response_to_pb(response)))
    result = triton_grpc.InferResult(theirs)
    got = result.as_numpy("out")
    assert got is not None
    assert got.shape == (2, 3)
    if datatype == "BYTES":
        assert got.reshape(-1).tolist() == expected.reshape(-1).tolist()
    else:
        assert got.dtype == expected.dtype
        assert np.array_equal(got, expected)
    assert result.get_response().id == "r"


@pytest.mark.parametrize("datatype", DATATYPES)
def test_tritonclient_request_is_decoded(datatype: str) -> None:
    data = sample(datatype, (2, 3))
    infer_input = triton_grpc.InferInput("x", [2, 3], datatype)
    infer_input.set_data_from_numpy(data)
    pb_request = _get_inference_request(
        model_name="m",
        inputs=[infer_input],
        model_version="",
        request_id="abc",
        outputs=[triton_grpc.InferRequestedOutput("out")],
        sequence_id=7,
        sequence_start=True,
        sequence_end=False,
        priority=3,
        timeout=None,
        parameters={"temperature": 0.5, "mode": "fast"},
    )
    request = request_from_pb(bp.ModelInferRequest.parse(pb_request.SerializeToString()))
    assert request.model_name == "m"
    assert request.model_version is None
    assert request.id == "abc"
    assert request.parameters == {
        "sequence_id": 7,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 3,  # tritonclient sends it as uint64_param
        "temperature": 0.5,
        "mode": "fast",
    }
    assert [o.name for o in request.outputs] == ["out"]
    (tensor,) = request.inputs
    assert tensor.shape == (2, 3)
    assert tensor.datatype == datatype
    if datatype == "BYTES":
        assert tensor.data.reshape(-1).tolist() == data.reshape(-1).tolist()
    else:
        assert tensor.data.dtype == data.dtype
        assert np.array_equal(tensor.data, data)


def test_raw_contents_are_numpy_bytes() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    response = InferenceResponse(model_name="m", outputs=[tensor_from_numpy("out", array)])
    msg = response_to_pb(response)
    assert msg.raw_output_contents == [array.tobytes()]
    assert msg.outputs[0].shape == [3, 4]
    assert msg.outputs[0].datatype == "FP32"
    assert msg.outputs[0].contents is None


def test_raw_decoding_does_not_copy() -> None:
    raw = np.arange(6, dtype=np.int64).tobytes()
    msg = bp.ModelInferRequest(
        inputs=[bp.ModelInferRequestInferInputTensor(name="x", datatype="INT64", shape=[2, 3])],
        raw_input_contents=[raw],
    )
    (tensor,) = request_from_pb(msg).inputs
    assert not tensor.data.flags.owndata  # a view over the message's bytes
    assert tensor.data.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_big_tensor_is_fast_enough() -> None:
    # One bulk copy each way; a per-element Python path would take seconds here.
    array = np.random.default_rng(0).random((1000, 1000), dtype=np.float32)
    response = InferenceResponse(model_name="m", outputs=[tensor_from_numpy("out", array)])
    msg = response_to_pb(response)
    assert len(msg.raw_output_contents[0]) == 4_000_000
    back = response_from_pb(msg)
    assert np.array_equal(back.outputs[0].data, array)


def test_empty_fields_become_none() -> None:
    request = request_from_pb(bp.ModelInferRequest())
    assert request == InferenceRequest(inputs=[])
    response = response_from_pb(bp.ModelInferResponse(model_name="m"))
    assert response == InferenceResponse(model_name="m", outputs=[])


def test_request_to_pb_overrides_model() -> None:
    request = InferenceRequest(inputs=[], model_name="a", model_version="1")
    msg = request_to_pb(request, model_name="b", model_version="9")
    assert (msg.model_name, msg.model_version) == ("b", "9")


# ---------------------------------------------------------------------------- typed contents


def _typed_request(datatype: str, shape: list[int], **contents: Any) -> bp.ModelInferRequest:
    return bp.ModelInferRequest(
        model_name="m",
        inputs=[
            bp.ModelInferRequestInferInputTensor(
                name="x", datatype=datatype, shape=shape, contents=bp.InferTensorContents(**contents)
            )
        ],
    )


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("BOOL", "bool_contents", [True, False, True, True, False, False]),
        ("INT8", "int_contents", [-128, 127, 0, 1, -1, 5]),
        ("INT16", "int_contents", [-32768, 32767, 0, 1, -1, 5]),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1, 0, 1, -1, 5]),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1, 0, 1, -1, 5]),
        ("UINT8", "uint_contents", [0, 255, 1, 2, 3, 4]),
        ("UINT16", "uint_contents", [0, 65535, 1, 2, 3, 4]),
        ("UINT32", "uint_contents", [0, 2**32 - 1, 1, 2, 3, 4]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1, 1, 2, 3, 4]),
        ("FP32", "fp32_contents", [0.5, -1.25, 3.0, 0.0, -0.0, float("inf")]),
        ("FP64", "fp64_contents", [math.pi, -1e300, 3.0, 0.0, 1e-300, -float("inf")]),
        ("BYTES", "bytes_contents", [b"a", b"", b"\xff", b"dd", b"e", b"f"]),
    ],
)
def test_typed_contents_accepted(datatype: str, field: str, values: list[Any]) -> None:
    msg = through_the_wire(_typed_request(datatype, [2, 3], **{field: values}))
    (tensor,) = request_from_pb(msg).inputs
    assert tensor.shape == (2, 3)
    assert tensor.data.shape == (2, 3)
    assert tensor.data.reshape(-1).tolist() == values
    if datatype != "BYTES":
        assert tensor.data.dtype == np.dtype(_NP[datatype])


def test_typed_contents_with_parameters() -> None:
    msg = _typed_request("FP32", [2], fp32_contents=[1.0, 2.0])
    msg.inputs[0].parameters = {"content_type": bp.InferParameter(string_param="np")}
    (tensor,) = request_from_pb(msg).inputs
    assert tensor.parameters == {"content_type": "np"}


def test_typed_contents_of_zero_elements() -> None:
    (tensor,) = request_from_pb(_typed_request("FP32", [0, 3])).inputs
    assert tensor.data.shape == (0, 3)
    assert tensor.data.dtype == np.float32


def test_missing_contents_with_no_raw_is_a_count_error() -> None:
    msg = bp.ModelInferRequest(
        inputs=[bp.ModelInferRequestInferInputTensor(name="x", datatype="INT32", shape=[2])]
    )
    with pytest.raises(
        BadInput, match=r"input 'x': shape \[2\] needs 2 elements, contents.int_contents has 0"
    ):
        request_from_pb(msg)


def test_typed_contents_wrong_count() -> None:
    with pytest.raises(
        BadInput, match=r"input 'x': shape \[2, 3\] needs 6 elements, contents.fp32_contents has 5"
    ):
        request_from_pb(_typed_request("FP32", [2, 3], fp32_contents=[1.0] * 5))


def test_typed_contents_wrong_field() -> None:
    with pytest.raises(
        BadInput, match=r"input 'x': FP32 data must be in contents.fp32_contents, got fp64_contents"
    ):
        request_from_pb(_typed_request("FP32", [2], fp64_contents=[1.0, 2.0]))


@pytest.mark.parametrize(
    ("datatype", "field", "value"),
    [("INT8", "int_contents", 128), ("INT16", "int_contents", -40000), ("UINT8", "uint_contents", 256)],
)
def test_typed_contents_out_of_range(datatype: str, field: str, value: int) -> None:
    with pytest.raises(
        BadInput, match=rf"input 'x': a value in contents.{field} is out of range for {datatype}"
    ):
        request_from_pb(_typed_request(datatype, [2], **{field: [0, value]}))


def test_fp16_needs_raw_contents() -> None:
    with pytest.raises(
        BadInput, match=r"input 'x': FP16 has no typed contents field; send it in raw contents"
    ):
        request_from_pb(_typed_request("FP16", [1], fp32_contents=[1.0]))


def test_unknown_datatype() -> None:
    with pytest.raises(BadInput, match=r"unknown datatype 'fp32'.*did you mean 'FP32'"):
        request_from_pb(_typed_request("fp32", [1], fp32_contents=[1.0]))


def test_tensor_contents_from_pb_names_outputs() -> None:
    with pytest.raises(BadInput, match=r"^output 'y': shape \[1\] needs 1 elements"):
        tensor_contents_from_pb("y", "INT64", [1], None, what="output")


# ---------------------------------------------------------------------------- raw contents errors


def _raw_request(datatype: str, shape: list[int], *raw: bytes) -> bp.ModelInferRequest:
    return bp.ModelInferRequest(
        inputs=[bp.ModelInferRequestInferInputTensor(name="x", datatype=datatype, shape=shape)],
        raw_input_contents=list(raw),
    )


def test_raw_byte_size_mismatch() -> None:
    with pytest.raises(BadInput, match=r"^input 'x': FP32 shape \[2, 3\] needs 24 bytes, got 20$"):
        request_from_pb(_raw_request("FP32", [2, 3], b"\x00" * 20))


def test_raw_byte_size_too_big() -> None:
    with pytest.raises(BadInput, match=r"^input 'x': INT64 shape \[1\] needs 8 bytes, got 9$"):
        request_from_pb(_raw_request("INT64", [1], b"\x00" * 9))


def test_raw_bytes_truncated() -> None:
    with pytest.raises(BadInput, match=r"input 'x': raw BYTES element 0 is truncated"):
        request_from_pb(_raw_request("BYTES", [1], b"\x05\x00\x00\x00abc"))


def test_raw_entry_count_mismatch() -> None:
    msg = _raw_request("FP32", [1], b"\x00" * 4, b"\x00" * 4)
    with pytest.raises(BadInput, match="raw_input_contents has 2 entries but there are 1 inputs"):
        request_from_pb(msg)


def test_raw_and_typed_contents_together() -> None:
    msg = _raw_request("FP32", [1], b"\x00" * 4)
    msg.inputs[0].contents = bp.InferTensorContents(fp32_contents=[1.0])
    with pytest.raises(
        BadInput, match="input 'x': contents must not be given when raw_input_contents is used"
    ):
        request_from_pb(msg)


def test_negative_dimension() -> None:
    with pytest.raises(BadInput, match=r"input 'x': negative dimension -1 in shape \[-1, 2\]"):
        request_from_pb(_raw_request("FP32", [-1, 2], b""))


def test_response_raw_count_mismatch() -> None:
    msg = bp.ModelInferResponse(
        model_name="m",
        outputs=[bp.ModelInferResponseInferOutputTensor(name="y", datatype="FP32", shape=[1])] * 2,
        raw_output_contents=[b"\x00" * 4],
    )
    with pytest.raises(BadInput, match="raw_output_contents has 1 entries but there are 2 outputs"):
        response_from_pb(msg)


# ---------------------------------------------------------------------------- parameters


def test_all_five_parameter_kinds_from_pb() -> None:
    params = params_from_pb(
        {
            "b": bp.InferParameter(bool_param=True),
            "f": bp.InferParameter(bool_param=False),
            "i": bp.InferParameter(int64_param=-(2**63)),
            "s": bp.InferParameter(string_param="hé"),
            "e": bp.InferParameter(string_param=""),
            "d": bp.InferParameter(double_param=0.125),
            "z": bp.InferParameter(double_param=0.0),
            "u": bp.InferParameter(uint64_param=2**64 - 1),
        }
    )
    assert params == {
        "b": True,
        "f": False,
        "i": -(2**63),
        "s": "hé",
        "e": "",
        "d": 0.125,
        "z": 0.0,
        "u": 2**64 - 1,
    }
    assert [type(params[k]) for k in "bfisedzu"] == [bool, bool, int, str, str, float, float, int]


def test_all_five_parameter_kinds_over_the_wire() -> None:
    """Parameters set by google.protobuf (as Triton's clients do) decode to Python values."""
    pb = service_pb2.ModelInferRequest(model_name="m")
    pb.parameters["b"].bool_param = False
    pb.parameters["i"].int64_param = -3
    pb.parameters["s"].string_param = "x"
    pb.parameters["d"].double_param = -2.5
    pb.parameters["u"].uint64_param = 2**63
    entry = pb.inputs.add(name="x", datatype="BOOL", shape=[1])
    entry.parameters["p"].uint64_param = 1
    entry.contents.bool_contents.append(True)
    pb.outputs.add(name="o").parameters["q"].double_param = 1.0
    request = request_from_pb(bp.ModelInferRequest.parse(pb.SerializeToString()))
    assert request.parameters == {"b": False, "i": -3, "s": "x", "d": -2.5, "u": 2**63}
    assert request.inputs[0].parameters == {"p": 1}
    assert request.inputs[0].data.tolist() == [True]
    assert request.outputs[0].parameters == {"q": 1.0}


def test_params_to_pb_kinds() -> None:
    pb = params_to_pb(
        {
            "b": True,
            "i": -5,
            "big": 2**63,
            "s": "x",
            "d": 1.5,
            "np_i": np.int32(4),
            "np_f": np.float32(0.5),
            "np_b": np.bool_(False),
        }
    )
    assert pb == {
        "b": bp.InferParameter(bool_param=True),
        "i": bp.InferParameter(int64_param=-5),
        "big": bp.InferParameter(uint64_param=2**63),
        "s": bp.InferParameter(string_param="x"),
        "d": bp.InferParameter(double_param=1.5),
        "np_i": bp.InferParameter(int64_param=4),
        "np_f": bp.InferParameter(double_param=0.5),
        "np_b": bp.InferParameter(bool_param=False),
    }
    # and Triton reads each kind from the oneof we chose
    msg = service_pb2.ModelInferResponse.FromString(bytes(bp.ModelInferResponse(parameters=pb)))
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in msg.parameters.items()}
    assert kinds == {
        "b": "bool_param",
        "i": "int64_param",
        "big": "uint64_param",
        "s": "string_param",
        "d": "double_param",
        "np_i": "int64_param",
        "np_f": "double_param",
        "np_b": "bool_param",
    }


@pytest.mark.parametrize(
    "value",
    [True, False, 0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 0.0, -1.5, float("inf"), "", "x"],
)
def test_params_round_trip(value: Any) -> None:
    back = params_from_pb(
        through_the_wire(bp.ModelInferRequest(parameters=params_to_pb({"k": value}))).parameters
    )
    assert back == {"k": value}
    assert type(back["k"]) is type(value)


def test_nan_parameter() -> None:
    back = params_from_pb(params_to_pb({"k": float("nan")}))
    assert math.isnan(back["k"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (2**64, "parameter 'k' = 18446744073709551616 does not fit in int64 or uint64"),
        (-(2**63) - 1, "does not fit in int64 or uint64"),
        (None, "parameter 'k' is a NoneType; gRPC parameters can only be bool, int, float or str"),
        ([1, 2], "parameter 'k' is a list"),
        ({"a": 1}, "parameter 'k' is a dict"),
        (b"x", "parameter 'k' is a bytes"),
    ],
)
def test_params_to_pb_rejects(value: Any, message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("[", r"\[")):
        params_to_pb({"k": value})


def test_unset_parameter_is_rejected() -> None:
    with pytest.raises(BadInput, match="request: parameter 'k' has no value"):
        params_from_pb({"k": bp.InferParameter()})


def test_response_parameters_error_names_the_output() -> None:
    response = InferenceResponse(
        model_name="m", outputs=[tensor_from_numpy("y", np.zeros(1, np.float32), parameters={"bad": None})]
    )
    with pytest.raises(BadInput, match="output 'y': parameter 'bad' is a NoneType"):
        response_to_pb(response)
