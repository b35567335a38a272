"""The routing key of a sequence over gRPC: the ``sequence-id`` request metadata a
proxy hashes on (Envoy/Istio ``consistentHash``, HAProxy ``hdr(sequence-id)``). On
ModelInfer and ModelStreamInfer it must name the same sequence as every message's
``sequence_id`` parameter, or the call is refused (INVALID_ARGUMENT naming both): a
proxy would otherwise route by one id while the engine serves another. A message
without the parameter takes the metadata's id. See docs/deploy.md#stickiness."""

from __future__ import annotations

from typing import Any, Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ...api import no_sequence_id, no_sequence_text
from ...errors import SequenceNotHeld
from ...proto.inference import InferParameter
from ...proto.upb import DecodedRequest
from ...replica import new_sequence_id
from ..grpchost.h2 import Wire
from ..grpchost.metadata import add_initial_metadata

#: request metadata naming the call's sequence; a response echoes its sequence's id
#: in its initial metadata under the same key
SEQUENCE_METADATA: Final = "sequence-id"
#: the kinds of InferParameter a sequence id is sent as
_ID_KINDS: Final = ("string_param", "int64_param", "uint64_param")


def metadata_sequence_id(stream: Stream[Any, Any]) -> str | None:
    """The call's ``sequence-id`` request metadata (None: none, empty or ``0``)."""
    metadata: Any = stream.metadata or {}
    value = metadata.get(SEQUENCE_METADATA)
    return None if value is None or no_sequence_text(value) else str(value)


def parameter_sequence_id(parameters: Any) -> str | None:
    """The ``sequence_id`` of a request's or response's protobuf parameters, betterproto2's
    or upb's (None: none)."""
    param = parameters.get("sequence_id")
    for kind in _ID_KINDS:
        value = getattr(param, kind, None)
        if not no_sequence_id(value):
            return str(value)
    return None


def agree_on_sequence(message: Any, metadata_id: str | None) -> None:
    """Check a decoded ``ModelInferRequest`` (a :class:`~actorserve.proto.upb.DecodedRequest`
    or betterproto2's message) against the call's ``sequence-id`` metadata (see the
    module docstring); :class:`GRPCError` INVALID_ARGUMENT when they differ."""
    if metadata_id is None:
        return
    if isinstance(message, DecodedRequest):
        parameters = message.request.parameters
        value = parameters.get("sequence_id")
        parameter = None if no_sequence_id(value) else str(value)
        if parameter is None:
            parameters["sequence_id"] = metadata_id
    else:
        parameter = parameter_sequence_id(message.parameters)
        if parameter is None:
            message.parameters["sequence_id"] = InferParameter(string_param=metadata_id)
    if parameter is not None and parameter != metadata_id:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"gRPC metadata 'sequence-id' ({metadata_id!r}) and parameter 'sequence_id' "
            f"({parameter!r}) name different sequences; send one id, or the same in both",
        )


def request_sequence_id(message: Any) -> str | None:
    """The ``sequence_id`` parameter of a decoded ``ModelInferRequest`` (upb's or
    betterproto2's; None: none)."""
    if isinstance(message, DecodedRequest):
        value = message.request.parameters.get("sequence_id")
        return None if no_sequence_id(value) else str(value)
    return parameter_sequence_id(message.parameters) if message is not None else None


def with_routing_hint(
    error: GRPCError, exc: BaseException, metadata_id: str | None, message: Any
) -> GRPCError:
    """``error`` (the status of ``exc``), told what to add when ``exc`` says a proxy sent
    the sequence to the wrong replica (:class:`~actorserve.errors.SequenceNotHeld`) and
    the call carried no ``sequence-id`` metadata: the id in the message body is invisible
    to a proxy, so stock tritonclient calls reach a random replica from the second one
    on. ``message``: the request that failed (its id goes into the hint)."""
    if metadata_id is not None or not isinstance(exc, SequenceNotHeld):
        return error
    sequence_id = request_sequence_id(message) or "<id>"
    headers = f"headers={{'{SEQUENCE_METADATA}': '{sequence_id}'}}"
    return GRPCError(
        error.status,
        f"{error.message}; this call carried no '{SEQUENCE_METADATA}' metadata, which the proxy "
        f"routes on: send it on every call of the sequence (tritonclient: infer(..., {headers}) or "
        f"start_stream(..., {headers}))",
    )


def echo_sequence(stream: Stream[Any, Any], sequence_id: str | None) -> None:
    """Echo ``sequence_id`` (None: nothing) in the call's initial metadata: a proxy or
    client learns a server-made id from the first answer."""
    if sequence_id is not None:
        add_initial_metadata(stream, SEQUENCE_METADATA, sequence_id)


def give_start_an_id(message: Any, replica: str) -> str | None:
    """Give ``message`` (a decoded ``ModelInferRequest``, upb's or betterproto2's) a
    server-made ``sequence_id`` naming ``replica`` when it starts a sequence without
    one, as the engine would (:func:`~actorserve.replica.mint_id`); return that id, or
    None when it is not such a start."""
    if isinstance(message, DecodedRequest):
        parameters = message.request.parameters
        if not no_sequence_id(parameters.get("sequence_id")) or not _true(parameters.get("sequence_start")):
            return None
        parameters["sequence_id"] = sequence_id = new_sequence_id(replica)
        return sequence_id
    start = message.parameters.get("sequence_start")
    if parameter_sequence_id(message.parameters) is not None or not getattr(start, "bool_param", False):
        return None
    sequence_id = new_sequence_id(replica)
    message.parameters["sequence_id"] = InferParameter(string_param=sequence_id)
    return sequence_id


def _true(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return value is True or (isinstance(value, int) and value == 1)


class SequenceWire(Wire):
    """A :class:`Wire` whose every message is checked against the call's
    ``sequence-id`` metadata (:func:`agree_on_sequence`) as it is read.

    ``name_first_start`` (ModelStreamInfer, a call without the metadata): when the
    first message starts a sequence without an id, it is given its server-made id here
    and that id goes into the call's initial metadata, which grpclib sends with the
    first response; so a proxy or client learns it from the answer's headers, as with
    ModelInfer."""

    __slots__ = ("name_first_start", "sequence_id")

    def __init__(self, stream: Stream[Any, Any], recv_type: Any, *, max_bytes: int, min_bytes: int) -> None:
        super().__init__(stream, recv_type, max_bytes=max_bytes, min_bytes=min_bytes)
        self.sequence_id = metadata_sequence_id(stream)
        #: the replica id to name the first message's new sequence with (None: do not)
        self.name_first_start: str | None = None

    async def recv(self) -> Any:
        message = await super().recv()
        if message is not None:
            agree_on_sequence(message, self.sequence_id)
            if self.name_first_start is not None and self.sequence_id is None:
                echo_sequence(self.stream, give_start_an_id(message, self.name_first_start))
        self.name_first_start = None
        return message


__all__ = [
    "SEQUENCE_METADATA",
    "SequenceWire",
    "agree_on_sequence",
    "echo_sequence",
    "give_start_an_id",
    "metadata_sequence_id",
    "parameter_sequence_id",
    "request_sequence_id",
    "with_routing_hint",
]
