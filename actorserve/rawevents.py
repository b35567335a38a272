"""A streamed response still in its wire form, for transports that can write it without
building it: what a front's engine client hands over when asked for raw batches.

A :class:`RawEvent` is one response of a stream: its stream's constants (a
:class:`StreamHead`, the same object for every event until they change), the output
shapes (the same tuple until they change), the response's parameters and each output's
data in Triton's raw layout (little-endian numbers; a BYTES element as a 4-byte length
and its bytes). Raw events are only made for outputs whose data is simple to write
from the raw bytes (numbers, or one BYTES element); any other response of such a
stream comes as an :class:`~actorserve.types.InferenceResponse`. No I/O.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import attrs
import numpy as np

from .types import DATATYPES, InferenceResponse, Tensor

#: numeric OIP datatype -> the little-endian numpy dtype of its raw data
RAW_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    name: dtype.newbyteorder("<") for name, dtype in DATATYPES.items() if name != "BYTES"
}


@attrs.frozen(slots=True, eq=False)
class StreamHead:
    """What every response of a stream repeats (compared by identity: a new head is a new
    object)."""

    model_name: str
    model_version: str | None
    id: str | None
    names: tuple[str, ...]
    datatypes: tuple[str, ...]
    #: each output's tensor parameters (not to be changed)
    parameters: tuple[dict[str, Any], ...]


class RawEvent(NamedTuple):
    """One response of a stream, its outputs' data still raw (see the module)."""

    head: StreamHead
    shapes: tuple[tuple[int, ...], ...]
    parameters: dict[str, Any]
    raws: list[bytes]


def response_of(event: RawEvent) -> InferenceResponse:
    """The response a raw event stands for (for the rare event a transport cannot write
    raw)."""
    head = event.head
    outputs = []
    for name, datatype, shape, parameters, raw in zip(
        head.names, head.datatypes, event.shapes, head.parameters, event.raws, strict=True
    ):
        if datatype == "BYTES":  # one element (see the module)
            data = np.empty(1, dtype=object)
            data[0] = raw[4:]
        else:
            data = np.frombuffer(raw, RAW_DTYPES[datatype]).reshape(shape)
        outputs.append(Tensor(name, shape, datatype, data, dict(parameters)))
    return InferenceResponse(head.model_name, outputs, head.model_version, head.id, event.parameters)
