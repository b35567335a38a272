"""Open Inference Protocol (KServe V2) types, as the engine and the models see them.

Tensors always hold a numpy array whose shape equals ``shape``; the transports decode
JSON lists, Triton's binary tensors and protobuf contents into these, and encode them
back (see :mod:`actorserve.codecs`). ``BYTES`` tensors hold a numpy ``object`` array of
``bytes``; a decoder may hand a tensor its elements packed instead
(:class:`~actorserve.packedbytes.PackedBytes`), which becomes that array when ``data``
is first read.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import numpy as np
import numpy.typing as npt

from .controls import RequestControl
from .errors import BadInput
from .packedbytes import PackedBytes

#: OIP datatype name -> numpy dtype. The names are case-sensitive on the wire.
DATATYPES: Final[dict[str, np.dtype[Any]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

_NUMPY_TO_DATATYPE: Final[dict[np.dtype[Any], str]] = {
    dt: name for name, dt in DATATYPES.items() if name != "BYTES"
}

#: Request parameters that steer the engine; they are not echoed to the model's outputs.
#: ``sequence_owner`` is set by the transports only (the fingerprint of the caller's
#: token, ``--bind-sequences-to-token``) and taken out before the model sees the request.
SEQUENCE_PARAMETERS: Final = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "sequence_cancel", "sequence_owner"}
)


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of an OIP datatype; :class:`BadInput` names the valid ones."""
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        hint = ""
        if isinstance(datatype, str) and datatype.upper() in DATATYPES:
            hint = f" (datatypes are case-sensitive: did you mean {datatype.upper()!r}?)"
        raise BadInput(
            f"unknown datatype {datatype!r}{hint}; expected one of {', '.join(DATATYPES)}"
        ) from None


def datatype_of(array: npt.NDArray[Any]) -> str:
    """The OIP datatype for a numpy array (str and bytes arrays become BYTES)."""
    dt = array.dtype
    if dt.kind in "OSU":
        return "BYTES"
    try:
        return _NUMPY_TO_DATATYPE[dt]
    except KeyError:
        raise BadInput(f"numpy dtype {dt} has no OIP datatype") from None


@attrs.define(slots=True, eq=False)
class Tensor:
    """One named tensor of a request or a response.

    ``data`` is a numpy array of ``shape``; build tensors with
    :func:`actorserve.codecs.tensor_from_numpy` (or the other codecs) so they are checked.
    A BYTES tensor may be built with :class:`~actorserve.packedbytes.PackedBytes` as its
    data (a decoder's, one buffer with offsets): it stays packed until ``data`` is read,
    which makes the numpy object array once; :attr:`packed` and :attr:`size` read it
    without that, and the encoders use them.
    """

    name: str
    shape: tuple[int, ...]
    datatype: str
    _data: npt.NDArray[Any] | PackedBytes
    parameters: dict[str, Any] = attrs.field(factory=dict)

    @property
    def data(self) -> npt.NDArray[Any]:
        if isinstance(self._data, PackedBytes):
            self._data = self._data.to_numpy().reshape(self.shape)
        return self._data

    @data.setter
    def data(self, value: npt.NDArray[Any] | PackedBytes) -> None:
        self._data = value

    @property
    def packed(self) -> PackedBytes | None:
        """The elements as a decoder packed them, if ``data`` has not been read since."""
        return self._data if isinstance(self._data, PackedBytes) else None

    @property
    def size(self) -> int:
        """How many elements the data holds (packed or not)."""
        return len(self._data) if isinstance(self._data, PackedBytes) else int(self._data.size)

    def renamed(self, name: str, parameters: dict[str, Any] | None = None) -> Tensor:
        """The same data (packed or not) under another name, with ``parameters``."""
        return Tensor(name, self.shape, self.datatype, self._data, dict(parameters or {}))

    def as_numpy(self) -> npt.NDArray[Any]:
        return self.data

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensor):
            return NotImplemented
        return (
            self.name == other.name
            and self.shape == other.shape
            and self.datatype == other.datatype
            and self.parameters == other.parameters
            and bool(np.array_equal(self.data, other.data))
        )


@attrs.frozen(slots=True)
class RequestedOutput:
    """An output the client asks for by name; parameters pass through to the model."""

    name: str
    parameters: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(slots=True)
class InferenceRequest:
    """An OIP inference request.

    ``model_name`` / ``model_version`` route the request; over REST and gRPC they come
    from the URL or the message, not from the JSON body. ``control``: what the server
    acts on (sequence, owner, priority, timeout), filled once by the door's wire module
    from the parameters (which keep those keys: models see them as before); None until
    then, and the engine fills it from the parameters for a request that arrives
    without one (:func:`actorserve.controls.control_of`).
    """

    inputs: list[Tensor]
    id: str | None = None
    parameters: dict[str, Any] = attrs.field(factory=dict)
    outputs: list[RequestedOutput] = attrs.field(factory=list)
    model_name: str | None = None
    model_version: str | None = None
    control: RequestControl | None = None

    def input(self, name: str, *, required: bool = True) -> Tensor | None:
        """The input called ``name``; :class:`BadInput` if required and missing."""
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        if required:
            got = ", ".join(t.name for t in self.inputs) or "none"
            raise BadInput(f"missing required input {name!r} (got {got})")
        return None

    def model_parameters(self) -> dict[str, Any]:
        """Request parameters without the engine's own sequence controls."""
        return {k: v for k, v in self.parameters.items() if k not in SEQUENCE_PARAMETERS}


@attrs.define(slots=True)
class InferenceResponse:
    """An OIP inference response (one of several when streaming)."""

    model_name: str
    outputs: list[Tensor]
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] = attrs.field(factory=dict)

    def output(self, name: str) -> Tensor:
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)
