"""Counting the inputs, outputs and BYTES elements of a ``ModelInferRequest`` (and the
input fields of TorchServe's ``PredictionsRequest``) on the wire, before it is parsed.

An empty ``bytes_contents`` element is two bytes on the wire and a Python ``bytes`` in a
list once betterproto2 has parsed it: a 15 MiB message of 8 M of them took 22 s and
gigabytes to parse, and 5,000 empty inputs take betterproto2 a tenth of a second.
:func:`check_request_counts` refuses such a message first: the top-level fields are
walked (each skipped by its length) to count inputs and outputs, and for the BYTES
elements a count of their tag byte in C gives an upper bound; only a message over the
limit by that bound is walked into its tensors to count exactly, stopping as soon as the
limit is passed. No I/O, no betterproto2.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from ..errors import BadInput
from ..limits import MAX_BYTES_ELEMENTS, MAX_FORM_FIELDS, MAX_INPUTS, MAX_PARAMETERS
from .inference import ModelInferRequest
from .torchserve.org.pytorch.serve.grpc.inference import PredictionsRequest

__all__ = ["PRECHECKS", "check_predictions_request", "check_request_counts"]

#: field numbers: ModelInferRequest.inputs and .outputs, InferInputTensor.contents,
#: InferTensorContents.bytes_contents
_INPUTS: Final = 5
_OUTPUTS: Final = 6
#: the ``parameters`` maps: of ModelInferRequest, InferInputTensor, InferRequestedOutputTensor
_PARAMETERS: Final = 4
_INPUT_PARAMETERS: Final = 4
_OUTPUT_PARAMETERS: Final = 2
_CONTENTS: Final = 5
_BYTES_CONTENTS: Final = 8
#: the tag of a bytes_contents element (field 8, wire type 2): at least one per element
_BYTES_TAG: Final = b"\x42"
_LENGTH_DELIMITED: Final = 2
#: PredictionsRequest.input (a map: one length-delimited entry per field)
_PREDICTION_INPUT: Final = 3


def check_request_counts(data: bytes, limit: int = MAX_BYTES_ELEMENTS) -> None:
    """:class:`BadInput` if the serialized ``ModelInferRequest`` ``data`` has more than
    :data:`~actorserve.limits.MAX_INPUTS` inputs or requested outputs, more than
    :data:`~actorserve.limits.MAX_PARAMETERS` parameters (in the request, or in one of its
    tensors), or more than
    ``limit`` ``bytes_contents`` elements in all. Malformed data is left to the parser."""
    try:
        _check_tensor_counts(data)
        if data.count(_BYTES_TAG) > limit:
            _check_bytes_elements(data, limit)
    except _Malformed:
        return  # the parser says what is wrong with it


def _check_tensor_counts(data: bytes) -> None:
    inputs = outputs = parameters = 0
    for number, start, end in _Fields(data, 0, len(data)):
        if number == _INPUTS:
            inputs += 1
            _check_parameters(data, start, end, _INPUT_PARAMETERS, "an input")
        elif number == _OUTPUTS:
            outputs += 1
            _check_parameters(data, start, end, _OUTPUT_PARAMETERS, "a requested output")
        parameters += number == _PARAMETERS
    for count, what in ((inputs, "inputs"), (outputs, "requested outputs")):
        if count > MAX_INPUTS:
            raise BadInput(
                f"{what}: {count} given, at most {MAX_INPUTS} allowed "
                "(limit MAX_INPUTS; see docs/security.md#limits)"
            )
    if parameters > MAX_PARAMETERS:
        raise _too_many_parameters("the request", parameters)


def _check_parameters(data: bytes, start: int, end: int, field: int, what: str) -> None:
    """Count the ``parameters`` map entries of one tensor message, stopping past the limit."""
    count = 0
    for number, _, _ in _Fields(data, start, end):
        count += number == field
        if count > MAX_PARAMETERS:
            raise _too_many_parameters(what, count)


def _too_many_parameters(what: str, count: int) -> BadInput:
    more = "more than " if what != "the request" else ""
    return BadInput(
        f"{what} has {more}{count} parameters, at most {MAX_PARAMETERS} are allowed "
        "(limit MAX_PARAMETERS; see docs/security.md#limits)"
    )


def _check_bytes_elements(data: bytes, limit: int) -> None:
    count = 0
    for number, start, end in _Fields(data, 0, len(data)):
        if number != _INPUTS:
            continue
        for number2, start2, end2 in _Fields(data, start, end):
            if number2 != _CONTENTS:
                continue
            for number3, _, _ in _Fields(data, start2, end2):
                if number3 == _BYTES_CONTENTS:
                    count += 1
                    if count > limit:
                        raise BadInput(
                            f"the request holds more than {limit} BYTES elements in bytes_contents "
                            "(limit MAX_BYTES_ELEMENTS; send them in raw_input_contents; "
                            "see docs/security.md#limits)"
                        )


def check_predictions_request(data: bytes) -> None:
    """:class:`BadInput` if a serialized ``PredictionsRequest`` has more than
    :data:`~actorserve.limits.MAX_FORM_FIELDS` entries in its ``input`` map (each one
    becomes an input of the handler, as a form field does over REST)."""
    try:
        fields = sum(number == _PREDICTION_INPUT for number, _, _ in _Fields(data, 0, len(data)))
    except _Malformed:
        return  # the parser says what is wrong with it
    if fields > MAX_FORM_FIELDS:
        raise BadInput(
            f"the request has {fields} input fields, at most {MAX_FORM_FIELDS} are allowed "
            "(limit MAX_FORM_FIELDS; see docs/security.md#limits)"
        )


class _Malformed(Exception):
    pass


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Malformed


class _Fields:
    """The length-delimited fields of ``data[pos:end]`` as (number, start, end); other
    wire types are skipped."""

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def __iter__(self) -> _Fields:
        return self

    def __next__(self) -> tuple[int, int, int]:
        data, end = self.data, self.end
        while self.pos < end:
            key, pos = _varint(data, self.pos, end)
            wire = key & 7
            if wire == _LENGTH_DELIMITED:
                length, pos = _varint(data, pos, end)
                if pos + length > end:
                    raise _Malformed
                self.pos = pos + length
                return key >> 3, pos, pos + length
            if wire == 0:
                _, pos = _varint(data, pos, end)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise _Malformed
            self.pos = pos
        raise StopIteration


#: the check to run on a request message's bytes before it is parsed, by message type
PRECHECKS: Final[Mapping[type, Callable[[bytes], None]]] = {
    ModelInferRequest: check_request_counts,
    PredictionsRequest: check_predictions_request,
}
