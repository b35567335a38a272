"""Triton's raw tensor layout (the binary tensor extension over REST, raw contents over
gRPC, tensors on the engine link): little-endian element bytes; BYTES elements each a
4-byte little-endian length followed by the bytes. No I/O; decoders raise
:class:`~actorserve.errors.BadInput` naming the tensor."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .codecs import check_shape, element_count
from .errors import BadInput
from .limits import BytesElements
from .packedbytes import PackedBytes
from .types import Tensor, numpy_dtype

__all__ = ["tensor_from_raw", "tensor_to_raw"]

_LEN = struct.Struct("<I")


def tensor_from_raw(
    name: str,
    datatype: str,
    shape: Sequence[int],
    raw: bytes | bytearray | memoryview,
    parameters: Mapping[str, Any] | None = None,
    budget: BytesElements | None = None,
) -> Tensor:
    """Decode raw little-endian tensor bytes (Triton's binary tensor / gRPC raw contents).

    BYTES elements are each a 4-byte little-endian length followed by the bytes; their
    count (the shape's) is added to ``budget``, the request's count of BYTES elements
    (:data:`~actorserve.limits.MAX_BYTES_ELEMENTS`), before any is decoded.
    """
    dims = check_shape(name, shape)
    dtype = numpy_dtype(datatype)
    count = element_count(dims)
    if datatype == "BYTES":
        # Every element takes at least its 4-byte length: a shape that claims more
        # elements than the data can hold is refused before the array is allocated.
        if count * 4 > len(raw):
            raise BadInput(
                f"input {name!r}: shape {list(dims)} needs {count} BYTES elements (at least "
                f"{count * 4} bytes), the raw data has {len(raw)} bytes"
            )
        (budget or BytesElements()).add(count, name)
        data = raw if isinstance(raw, bytes) else bytes(raw)
        # packed, never a Python object per element: a model that reads ``data`` makes
        # the object array then (see Tensor.data)
        packed = PackedBytes.from_raw(name, data, count)
        return Tensor(name, dims, datatype, packed, dict(parameters or {}))
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise BadInput(
            f"input {name!r}: {datatype} shape {list(dims)} needs {expected} bytes, got {len(raw)}"
        )
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(dims)
    return Tensor(name, dims, datatype, array, dict(parameters or {}))


def tensor_to_raw(tensor: Tensor) -> bytes:
    """Encode a tensor's data as raw little-endian bytes (see :func:`tensor_from_raw`)."""
    packed = tensor.packed
    if packed is not None:
        return packed.to_raw()
    if tensor.datatype == "BYTES":
        # one growing buffer: a list of parts would hold a 4-byte ``bytes`` (40 bytes of
        # memory) and two pointers per element until the join
        out = bytearray()
        for value in tensor.data.reshape(-1):
            item = value if isinstance(value, bytes) else str(value).encode()
            out += _LEN.pack(len(item))
            out += item
        return bytes(out)
    data = tensor.data
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    return np.ascontiguousarray(data).tobytes()
