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

from typing import Any, NamedTuple

import attrs


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
