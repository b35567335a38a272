"""actorserve/proto: generated code is up to date and wire-compatible with Triton.

Triton's own compiled proto ships with tritonclient (``tritonclient.grpc.service_pb2``);
it is the reference for every field name, number and type here.
"""

from __future__ import annotations

import math
from typing import Any

import betterproto2
import grpclib.const
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as PbMessage
from tritonclient.grpc import service_pb2

from actorserve.proto import inference as bp
from actorserve.proto import regenerate
from actorserve.proto.message_pool import default_message_pool

_URL_PREFIX = "type.googleapis.com/"

#: protobuf descriptor type -> betterproto2 type name
_PB_TYPE_NAMES = {
    FieldDescriptor.TYPE_BOOL: betterproto2.TYPE_BOOL,
    FieldDescriptor.TYPE_INT32: betterproto2.TYPE_INT32,
    FieldDescriptor.TYPE_INT64: betterproto2.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32: betterproto2.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64: betterproto2.TYPE_UINT64,
    FieldDescriptor.TYPE_FLOAT: betterproto2.TYPE_FLOAT,
    FieldDescriptor.TYPE_DOUBLE: betterproto2.TYPE_DOUBLE,
    FieldDescriptor.TYPE_STRING: betterproto2.TYPE_STRING,
    FieldDescriptor.TYPE_BYTES: betterproto2.TYPE_BYTES,
    FieldDescriptor.TYPE_MESSAGE: betterproto2.TYPE_MESSAGE,
    FieldDescriptor.TYPE_ENUM: betterproto2.TYPE_ENUM,
}

#: Triton's model configuration (model_config.proto) is large: we keep the fields we
#: fill, so for these messages ours are a subset of Triton's (each still matching).
_PARTIAL = frozenset(
    f"inference.{name}"
    for name in (
        "ModelConfig",
        "ModelInput",
        "ModelOutput",
        "ModelInstanceGroup",
        "ModelDynamicBatching",
        "ModelSequenceBatching",
    )
)


def _generated_messages() -> dict[str, type[betterproto2.Message]]:
    """Full proto name (``inference.X.Y``) -> generated class, for every generated message."""
    out = {}
    for url, cls in default_message_pool.url_to_type.items():
        full_name = url.removeprefix(_URL_PREFIX)
        if full_name.startswith("inference.") and cls.__module__ == bp.__name__:
            out[full_name] = cls
    return out


def _proto_name(cls: type) -> str:
    return default_message_pool.type_to_url[cls].removeprefix(_URL_PREFIX)


# ---------------------------------------------------------------------------- drift


def test_generated_code_is_up_to_date() -> None:
    pytest.importorskip("grpc_tools", reason="needs grpcio-tools (the 'test' extra) to run protoc")
    problems = regenerate.check()
    assert not problems, "\n\n".join(problems)


def test_check_reports_drift(tmp_path: Any) -> None:
    pytest.importorskip("grpc_tools", reason="needs grpcio-tools (the 'test' extra) to run protoc")
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "__init__.py").write_text("# stale\n")
    problems = regenerate.check(tmp_path)
    assert len(problems) == 3 + len(regenerate.TORCHSERVE[2]) + 2
    assert problems[0].startswith("inference/__init__.py: out of date")
    assert "-# stale" in problems[0]
    assert problems[1].startswith("actorserve/v1/__init__.py: missing")
    assert problems[2].startswith("message_pool.py: missing")
    # TorchServe's tree is checked too
    assert [p.partition(":")[0] for p in problems[3:-2]] == [
        f"torchserve/{f}" for f in regenerate.TORCHSERVE[2]
    ]
    assert all(p.endswith("missing (run python -m actorserve.proto.regenerate)") for p in problems[3:])
    # and the descriptor the upb codec of the hot messages is built from
    assert problems[-2].startswith(f"{regenerate.UPB_DESCRIPTOR}: missing")
    # and the served files reflection answers with
    assert problems[-1].startswith(f"{regenerate.SERVED_DESCRIPTORS}: missing")


def test_missing_tooling_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "grpc_tools" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(regenerate.ToolingMissing, match=r"grpcio-tools.*pip install"):
        regenerate.generate(regenerate.PROTO_DIR / "never-written")
    assert regenerate.main(["--check"]) == 2
    assert not (regenerate.PROTO_DIR / "never-written").exists()


@pytest.mark.parametrize("generated", ["inference/__init__.py", "actorserve/v1/__init__.py"])
def test_generated_code_needs_no_protoc_at_runtime(generated: str) -> None:
    source = (regenerate.PROTO_DIR / generated).read_text()
    for forbidden in ("import grpc\n", "google.protobuf", "grpc_tools", "betterproto2_compiler"):
        assert forbidden not in source


# ---------------------------------------------------------------------------- descriptors


def _pb_descriptor(full_name: str) -> Descriptor:
    return service_pb2.DESCRIPTOR.pool.FindMessageTypeByName(full_name)


def test_expected_messages_are_generated() -> None:
    names = set(_generated_messages())
    for required in [
        "ServerLiveRequest",
        "ServerLiveResponse",
        "ServerReadyRequest",
        "ServerReadyResponse",
        "ModelReadyRequest",
        "ModelReadyResponse",
        "ServerMetadataRequest",
        "ServerMetadataResponse",
        "ModelMetadataRequest",
        "ModelMetadataResponse",
        "ModelMetadataResponse.TensorMetadata",
        "InferParameter",
        "InferTensorContents",
        "ModelInferRequest",
        "ModelInferRequest.InferInputTensor",
        "ModelInferRequest.InferRequestedOutputTensor",
        "ModelInferResponse",
        "ModelInferResponse.InferOutputTensor",
        "ModelStreamInferResponse",
        "ModelRepositoryParameter",
        "RepositoryIndexRequest",
        "RepositoryIndexResponse",
        "RepositoryIndexResponse.ModelIndex",
        "RepositoryModelLoadRequest",
        "RepositoryModelLoadResponse",
        "RepositoryModelUnloadRequest",
        "RepositoryModelUnloadResponse",
        "ModelConfigRequest",
        "ModelConfigResponse",
        "ModelConfig",
        "ModelStatisticsRequest",
        "ModelStatisticsResponse",
        "ModelStatistics",
        "InferStatistics",
        "InferBatchStatistics",
        "StatisticDuration",
    ]:
        assert f"inference.{required}" in names


@pytest.mark.parametrize("full_name", sorted(_generated_messages()))
def test_fields_match_triton(full_name: str) -> None:
    """Every field: same name, number, type, cardinality, oneof and message type as Triton's."""
    cls = _generated_messages()[full_name]
    ours = cls._betterproto.meta_by_field_name
    cls_by_field = cls._betterproto.cls_by_field
    theirs = _pb_descriptor(full_name)
    if full_name in _PARTIAL:
        assert set(ours) <= set(theirs.fields_by_name), "a field Triton does not have"
    else:
        assert set(ours) == set(theirs.fields_by_name), "field names differ"
    for name, meta in ours.items():
        ref = theirs.fields_by_name[name]
        where = f"{full_name}.{name}"
        assert meta.number == ref.number, where
        if ref.message_type is not None and ref.message_type.GetOptions().map_entry:
            assert meta.proto_type == betterproto2.TYPE_MAP, where
            assert meta.map_meta is not None
            key_ref, value_ref = (
                ref.message_type.fields_by_name["key"],
                ref.message_type.fields_by_name["value"],
            )
            assert meta.map_meta[0].proto_type == _PB_TYPE_NAMES[key_ref.type], where
            assert meta.map_meta[1].proto_type == _PB_TYPE_NAMES[value_ref.type], where
            if value_ref.message_type is not None:
                assert _proto_name(cls_by_field[f"{name}.value"]) == value_ref.message_type.full_name
            continue
        assert meta.proto_type == _PB_TYPE_NAMES[ref.type], where
        assert bool(meta.repeated) == ref.is_repeated, where
        if ref.message_type is not None:
            assert _proto_name(cls_by_field[name]) == ref.message_type.full_name, where
        ref_oneof = ref.containing_oneof.name if ref.containing_oneof is not None else None
        assert meta.group == ref_oneof, where


def test_infer_parameter_has_all_five_kinds() -> None:
    meta = bp.InferParameter._betterproto.meta_by_field_name
    assert {name: (m.number, m.proto_type, m.group) for name, m in meta.items()} == {
        "bool_param": (1, "bool", "parameter_choice"),
        "int64_param": (2, "int64", "parameter_choice"),
        "string_param": (3, "string", "parameter_choice"),
        "double_param": (4, "double", "parameter_choice"),
        "uint64_param": (5, "uint64", "parameter_choice"),
    }


def test_service_matches_triton() -> None:
    """Routes, streaming flags and message types of every RPC we serve."""
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    mapping = bp.GrpcInferenceServiceBase().__mapping__()
    assert len(mapping) == 12
    cardinality = {
        (False, False): grpclib.const.Cardinality.UNARY_UNARY,
        (False, True): grpclib.const.Cardinality.UNARY_STREAM,
        (True, False): grpclib.const.Cardinality.STREAM_UNARY,
        (True, True): grpclib.const.Cardinality.STREAM_STREAM,
    }
    for route, handler in mapping.items():
        service, method_name = route.strip("/").split("/")
        assert service == theirs.full_name == "inference.GRPCInferenceService"
        method = theirs.methods_by_name[method_name]
        assert handler.cardinality == cardinality[(method.client_streaming, method.server_streaming)], route
        assert _proto_name(handler.request_type) == method.input_type.full_name, route
        assert _proto_name(handler.reply_type) == method.output_type.full_name, route
    assert (
        mapping["/inference.GRPCInferenceService/ModelStreamInfer"].cardinality
        == grpclib.const.Cardinality.STREAM_STREAM
    )


# ---------------------------------------------------------------------------- wire


def assert_same(ours: betterproto2.Message, theirs: PbMessage, path: str = "") -> None:
    """Compare a betterproto2 message with a google.protobuf one, field by field."""
    descriptor = theirs.DESCRIPTOR
    assert _proto_name(type(ours)) == descriptor.full_name, path
    for field in descriptor.fields:
        where = f"{path}.{field.name}" if path else field.name
        mine = getattr(ours, field.name)
        ref = getattr(theirs, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert set(mine) == set(ref), where
            value_field = field.message_type.fields_by_name["value"]
            for key in ref:
                if value_field.message_type is not None:
                    assert_same(mine[key], ref[key], f"{where}[{key!r}]")
                else:
                    assert mine[key] == ref[key], f"{where}[{key!r}]"
        elif field.is_repeated:
            assert len(mine) == len(ref), where
            for i, (a, b) in enumerate(zip(mine, ref, strict=True)):
                if field.message_type is not None:
                    assert_same(a, b, f"{where}[{i}]")
                else:
                    _assert_scalar(a, b, f"{where}[{i}]")
        elif field.message_type is not None:
            if theirs.HasField(field.name):
                assert mine is not None, where
                assert_same(mine, ref, where)
            else:
                assert mine is None, where
        elif field.containing_oneof is not None:
            if theirs.HasField(field.name):
                _assert_scalar(mine, ref, where)
            else:
                assert mine is None, where
        else:
            _assert_scalar(mine, ref, where)


def _assert_scalar(a: Any, b: Any, where: str) -> None:
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def _bp_params() -> dict[str, bp.InferParameter]:
    return {
        "flag": bp.InferParameter(bool_param=True),
        "off": bp.InferParameter(bool_param=False),
        "count": bp.InferParameter(int64_param=-(2**63)),
        "name": bp.InferParameter(string_param="héllo"),
        "empty": bp.InferParameter(string_param=""),
        "ratio": bp.InferParameter(double_param=0.25),
        "zero": bp.InferParameter(double_param=0.0),
        "big": bp.InferParameter(uint64_param=2**64 - 1),
    }


def _bp_request() -> bp.ModelInferRequest:
    contents = bp.InferTensorContents(
        bool_contents=[True, False, True],
        int_contents=[-(2**31), 0, 2**31 - 1],
        int64_contents=[-(2**63), 2**63 - 1],
        uint_contents=[0, 2**32 - 1],
        uint64_contents=[2**64 - 1, 1],
        fp32_contents=[1.5, -0.25, float("inf")],
        fp64_contents=[math.pi, float("nan"), -0.0],
        bytes_contents=[b"", b"\x00\xff", "é".encode()],
    )
    return bp.ModelInferRequest(
        model_name="adder",
        model_version="3",
        id="req-1",
        parameters=_bp_params(),
        inputs=[
            bp.ModelInferRequestInferInputTensor(
                name="INPUT0",
                datatype="FP32",
                shape=[2, 3],
                parameters={"binary_data_size": bp.InferParameter(int64_param=24)},
            ),
            bp.ModelInferRequestInferInputTensor(
                name="TYPED", datatype="INT32", shape=[-1, 3], contents=contents
            ),
        ],
        outputs=[
            bp.ModelInferRequestInferRequestedOutputTensor(
                name="OUTPUT0", parameters={"classification": bp.InferParameter(int64_param=2)}
            ),
            bp.ModelInferRequestInferRequestedOutputTensor(name="OUTPUT1"),
        ],
        raw_input_contents=[bytes(range(24)), b""],
    )


def _pb_response() -> Any:
    resp = service_pb2.ModelInferResponse(
        model_name="adder", model_version="3", id="req-1", raw_output_contents=[b"\x01\x02", b""]
    )
    resp.parameters["flag"].bool_param = True
    resp.parameters["count"].int64_param = -7
    resp.parameters["name"].string_param = "x"
    resp.parameters["ratio"].double_param = -1e300
    resp.parameters["big"].uint64_param = 2**63
    out = resp.outputs.add(name="OUT", datatype="UINT8", shape=[1, 2])
    out.parameters["p"].string_param = "v"
    typed = resp.outputs.add(name="TYPED", datatype="BYTES", shape=[2])
    typed.contents.bytes_contents.extend([b"ab", b""])
    typed.contents.fp64_contents.extend([2.5])
    typed.contents.uint64_contents.extend([2**64 - 1])
    return resp


def test_request_betterproto_to_triton() -> None:
    ours = _bp_request()
    theirs = service_pb2.ModelInferRequest.FromString(bytes(ours))
    assert_same(ours, theirs)
    # spot checks, in case assert_same itself were wrong
    assert theirs.raw_input_contents[0] == bytes(range(24))
    assert theirs.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"
    assert theirs.parameters["off"].WhichOneof("parameter_choice") == "bool_param"
    assert theirs.parameters["zero"].WhichOneof("parameter_choice") == "double_param"
    assert theirs.parameters["empty"].WhichOneof("parameter_choice") == "string_param"
    assert list(theirs.inputs[1].contents.uint64_contents) == [2**64 - 1, 1]
    assert list(theirs.inputs[1].shape) == [-1, 3]


def test_request_triton_to_betterproto() -> None:
    theirs = service_pb2.ModelInferRequest.FromString(bytes(_bp_request()))
    ours = bp.ModelInferRequest.parse(theirs.SerializeToString())
    assert_same(ours, theirs)
    assert ours.parameters["off"].bool_param is False


def test_response_triton_to_betterproto() -> None:
    theirs = _pb_response()
    ours = bp.ModelInferResponse.parse(theirs.SerializeToString())
    assert_same(ours, theirs)
    assert ours.parameters["big"].uint64_param == 2**63
    assert ours.outputs[1].contents is not None
    assert ours.outputs[1].contents.bytes_contents == [b"ab", b""]
    assert ours.outputs[0].contents is None


def test_response_betterproto_to_triton() -> None:
    ours = bp.ModelInferResponse.parse(_pb_response().SerializeToString())
    theirs = service_pb2.ModelInferResponse.FromString(bytes(ours))
    assert_same(ours, theirs)


def test_stream_response_both_ways() -> None:
    theirs = service_pb2.ModelStreamInferResponse(error_message="", infer_response=_pb_response())
    ours = bp.ModelStreamInferResponse.parse(theirs.SerializeToString())
    assert_same(ours, theirs)
    back = service_pb2.ModelStreamInferResponse.FromString(bytes(ours))
    assert_same(ours, back)
    assert back == theirs

    error = bp.ModelStreamInferResponse(error_message="model 'x' failed: boom")
    decoded = service_pb2.ModelStreamInferResponse.FromString(bytes(error))
    assert decoded.error_message == "model 'x' failed: boom"
    assert not decoded.HasField("infer_response")
    assert_same(error, decoded)


def test_unary_messages_both_ways() -> None:
    pairs: list[tuple[betterproto2.Message, type[PbMessage]]] = [
        (bp.ServerLiveResponse(live=True), service_pb2.ServerLiveResponse),
        (bp.ServerReadyResponse(ready=True), service_pb2.ServerReadyResponse),
        (bp.ModelReadyRequest(name="m", version="2"), service_pb2.ModelReadyRequest),
        (
            bp.ServerMetadataResponse(name="actorserve", version="0.1.0", extensions=["a", "b"]),
            service_pb2.ServerMetadataResponse,
        ),
        (
            bp.ModelMetadataResponse(
                name="m",
                versions=["1", "2"],
                platform="actorserve",
                inputs=[bp.ModelMetadataResponseTensorMetadata(name="x", datatype="FP32", shape=[-1, 4])],
                outputs=[bp.ModelMetadataResponseTensorMetadata(name="y", datatype="BYTES", shape=[1])],
            ),
            service_pb2.ModelMetadataResponse,
        ),
        (
            bp.RepositoryIndexResponse(
                models=[
                    bp.RepositoryIndexResponseModelIndex(name="m", version="1", state="READY"),
                    bp.RepositoryIndexResponseModelIndex(name="n", state="UNAVAILABLE", reason="boom"),
                ]
            ),
            service_pb2.RepositoryIndexResponse,
        ),
        (
            bp.RepositoryModelLoadRequest(
                repository_name="r",
                model_name="m",
                parameters={
                    "config": bp.ModelRepositoryParameter(string_param="{}"),
                    "file:1/model.bin": bp.ModelRepositoryParameter(bytes_param=b"\x00\x01"),
                    "flag": bp.ModelRepositoryParameter(bool_param=False),
                },
            ),
            service_pb2.RepositoryModelLoadRequest,
        ),
        (
            bp.RepositoryModelUnloadRequest(
                model_name="m",
                parameters={"unload_dependents": bp.ModelRepositoryParameter(bool_param=True)},
            ),
            service_pb2.RepositoryModelUnloadRequest,
        ),
    ]
    for ours, pb_cls in pairs:
        theirs = pb_cls.FromString(bytes(ours))
        assert_same(ours, theirs)
        assert_same(type(ours).parse(theirs.SerializeToString()), theirs)


def test_management_service_serves_every_rpc_of_its_proto() -> None:
    """``actorserve.v1.Management``: the handlers we register are the generated service's
    routes, with its message types (management.proto is ours: no Triton reference)."""
    from actorserve.proto.actorserve import v1
    from actorserve.transport.grpc.management_service import ManagementService

    class NoCalls:
        def tracked(self, func: Any) -> Any:
            return func

    generated = v1.ManagementBase().__mapping__()
    ours = ManagementService(None, NoCalls()).__mapping__()  # type: ignore[arg-type]
    assert (
        sorted(ours)
        == sorted(generated)
        == [
            "/actorserve.v1.Management/DescribeModel",
            "/actorserve.v1.Management/SetDefaultVersion",
            "/actorserve.v1.Management/SetWorkers",
        ]
    )
    for route, handler in ours.items():
        assert handler.cardinality == generated[route].cardinality == grpclib.const.Cardinality.UNARY_UNARY
        assert (handler.request_type, handler.reply_type) == (
            generated[route].request_type,
            generated[route].reply_type,
        )
