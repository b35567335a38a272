"""The hot gRPC inference messages through upb (the C ``protobuf`` runtime): decoding a
``ModelInferRequest`` and encoding a ``ModelInferResponse`` / ``ModelStreamInferResponse``
without betterproto2's per-field Python.

betterproto2 stays the one published API (:mod:`actorserve.proto.inference`); this is
an equivalent codec for the common shape only, and falls back to it for anything else,
so what a client sees never changes:

- a request decodes here only when it parses in canonical form with no unknown field
  (upb skips a field of the wrong wire type, betterproto2 decodes it), its tensors are in raw contents (one per
  input, none with typed contents), every parameter has a value and no parameter map
  holds more than one entry (upb keeps a map in hash order, betterproto2 in wire order,
  and the order shows in the parameters a model sees). Anything else (typed contents, a
  malformed message, a :class:`~actorserve.errors.BadInput`) is decoded again by
  betterproto2 and fails or succeeds exactly as before;
- a response encodes here only when it would be raw contents and no parameter map has
  more than one entry; the bytes are the ones betterproto2 writes (tested).

The classes are built from ``grpc_service.proto``'s committed descriptor
(:mod:`.upb_descriptor`) in a private descriptor pool: tritonclient registers the same
``inference.*`` names in the default pool, and both must load in one process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from ..errors import BadInput
from ..limits import BytesElements
from ..raw import tensor_from_raw, tensor_to_raw
from ..rawevents import RawEvent, response_of
from ..types import InferenceRequest, InferenceResponse, RequestedOutput
from .convert import request_from_pb, response_to_pb
from .inference import ModelInferRequest, ModelStreamInferResponse
from .upb_descriptor import SERIALIZED

_POOL: Final = descriptor_pool.DescriptorPool()
_POOL.AddSerializedFile(SERIALIZED)


def _message_class(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"inference.{name}"))


UpbInferRequest: Final = _message_class("ModelInferRequest")
UpbInferResponse: Final = _message_class("ModelInferResponse")
UpbStreamInferResponse: Final = _message_class("ModelStreamInferResponse")

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_UINT64_MAX: Final = 2**64 - 1


class DecodedRequest:
    """A ``ModelInferRequest`` already converted: the request, and the three strings the
    transport reads off a message (for access lines and in-band errors)."""

    __slots__ = ("id", "model_name", "model_version", "request")

    def __init__(self, model_name: str, model_version: str, id: str, request: InferenceRequest) -> None:
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.request = request


class _InferRequestDecoder:
    """What :class:`~actorserve.transport.grpchost.wire.Wire` decodes ``ModelInferRequest``
    with: :meth:`FromString` gives a :class:`DecodedRequest`, or the betterproto2
    message (and its errors) when the fast path does not apply."""

    __name__ = "ModelInferRequest"  # what the wire's "not a valid ... message" names
    #: the betterproto2 class it stands for (the wire's count checks are looked up by it)
    message_class = ModelInferRequest

    @staticmethod
    def FromString(data: bytes) -> DecodedRequest | ModelInferRequest:
        decoded = decode_request(data)
        return decoded if decoded is not None else ModelInferRequest.FromString(data)


#: the ``recv_type`` of the inference methods' wires
InferRequestDecoder: Final = _InferRequestDecoder()


def request_of(message: DecodedRequest | ModelInferRequest) -> InferenceRequest:
    """The request of what :data:`InferRequestDecoder` decoded (betterproto2's messages
    through :func:`~actorserve.proto.convert.request_from_pb`, and its errors)."""
    return message.request if isinstance(message, DecodedRequest) else request_from_pb(message)


def decode_request(data: bytes) -> DecodedRequest | None:
    """``data`` as a :class:`DecodedRequest`, or None where betterproto2 must decide."""
    try:
        msg = UpbInferRequest.FromString(data)
    except DecodeError:
        return None
    # A field of the wrong wire type is an unknown field to upb but a wrong value to
    # betterproto2 (an error here); after dropping unknown fields, the size tells.
    # (Also sends the rare non-canonical encoding, e.g. unpacked shapes, the slow way.)
    msg.DiscardUnknownFields()
    if msg.ByteSize() != len(data):
        return None
    entries, raw = msg.inputs, msg.raw_input_contents
    if len(raw) != len(entries):
        return None  # typed contents, or a raw-contents mistake betterproto2's path names
    try:
        inputs = []
        budget = BytesElements()
        for entry, data_ in zip(entries, raw, strict=True):
            params = _params(entry.parameters)
            if params is None or entry.HasField("contents"):
                return None
            inputs.append(
                tensor_from_raw(entry.name, entry.datatype, list(entry.shape), data_, params, budget)
            )
        outputs = []
        for out in msg.outputs:
            params = _params(out.parameters)
            if params is None:
                return None
            outputs.append(RequestedOutput(out.name, params))
    except BadInput:
        return None
    parameters = _params(msg.parameters)
    if parameters is None:
        return None
    request = InferenceRequest(
        inputs=inputs,
        id=msg.id or None,
        parameters=parameters,
        outputs=outputs,
        model_name=msg.model_name or None,
        model_version=msg.model_version or None,
    )
    return DecodedRequest(msg.model_name, msg.model_version, msg.id, request)


def _params(params: Any) -> dict[str, Any] | None:
    """A parameter map as plain values; None if an entry has no value or the order of
    several entries would be lost."""
    if len(params) > 1:
        return None
    out: dict[str, Any] = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        if which is None:
            return None
        out[key] = getattr(param, which)
    return out


# --------------------------------------------------------------------------- responses


def response_message(response: InferenceResponse) -> Any:
    """``response`` as a ``ModelInferResponse`` (raw contents), upb's where it applies."""
    msg = UpbInferResponse()
    if _fill(msg, response):
        return msg
    return response_to_pb(response)


def stream_response_message(response: InferenceResponse) -> Any:
    """``response`` as a ``ModelStreamInferResponse`` (Triton's stream dialect)."""
    msg = UpbStreamInferResponse()
    if _fill(msg.infer_response, response):  # filled in place: no copy
        return msg
    return ModelStreamInferResponse(infer_response=response_to_pb(response))


def stream_raw_message(event: RawEvent) -> Any:
    """A front's raw event (:mod:`actorserve.rawevents`) as the ``ModelStreamInferResponse``
    of the response it stands for: its raw data is already ``raw_output_contents``."""
    head = event.head
    if _simple(event.parameters) and all(_simple(p) for p in head.parameters):
        msg = UpbStreamInferResponse()
        inner = msg.infer_response
        inner.model_name = head.model_name
        inner.model_version = head.model_version or ""
        inner.id = head.id or ""
        if _set_params(inner.parameters, event.parameters):
            for name, datatype, shape, parameters in zip(
                head.names, head.datatypes, event.shapes, head.parameters, strict=True
            ):
                entry = inner.outputs.add(name=name, datatype=datatype, shape=shape)
                if not _set_params(entry.parameters, parameters):
                    break
            else:
                inner.raw_output_contents.extend(event.raws)
                return msg
    return stream_response_message(response_of(event))


def _fill(msg: Any, response: InferenceResponse) -> bool:
    """Fill an empty upb ``ModelInferResponse``; False where betterproto2 must encode."""
    if not _simple(response.parameters) or not all(_simple(t.parameters) for t in response.outputs):
        return False
    msg.model_name = response.model_name
    msg.model_version = response.model_version or ""
    msg.id = response.id or ""
    if not _set_params(msg.parameters, response.parameters):
        return False
    raw = []
    for tensor in response.outputs:
        entry = msg.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        if not _set_params(entry.parameters, tensor.parameters):
            return False
        raw.append(tensor_to_raw(tensor))
    msg.raw_output_contents.extend(raw)
    return True


def _simple(params: Mapping[str, Any]) -> bool:
    return len(params) <= 1


def _set_params(target: Any, params: Mapping[str, Any]) -> bool:
    """As :func:`~actorserve.proto.convert.params_to_pb`; False for a value it refuses."""
    for key, value in params.items():
        if isinstance(value, np.generic):
            value = value.item()
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if _INT64_MIN <= value <= _INT64_MAX:
                param.int64_param = value
            elif 0 <= value <= _UINT64_MAX:
                param.uint64_param = value
            else:
                return False
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            return False
    return True


__all__ = [
    "DecodedRequest",
    "InferRequestDecoder",
    "UpbInferRequest",
    "UpbInferResponse",
    "UpbStreamInferResponse",
    "decode_request",
    "request_of",
    "response_message",
    "stream_raw_message",
    "stream_response_message",
]
