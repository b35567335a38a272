"""BYTES elements kept packed (one buffer, two offset arrays): reading them, encoding
them raw and as JSON exactly as the object arrays were, and a Tensor that holds them
until a model reads ``data``."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actorserve.codecs import tensor_to_json
from actorserve.errors import BadInput
from actorserve.jsonbytes import bytes_json
from actorserve.packedbytes import PackedBytes
from actorserve.raw import tensor_from_raw, tensor_to_raw
from actorserve.types import Tensor

elements = st.lists(st.binary(max_size=6) | st.text(max_size=4).map(str.encode), max_size=40)


def _raw(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


@given(elements)
def test_raw_round_trip_reads_each_element(values: list[bytes]) -> None:
    packed = PackedBytes.from_raw("x", _raw(values), len(values))
    assert len(packed) == len(values)
    assert list(packed) == values
    assert [packed[i] for i in range(len(values))] == values
    assert packed.to_raw() is packed.buffer  # raw in, raw out: no copy
    assert packed.to_numpy().tolist() == values


@given(elements)
def test_json_is_what_the_object_array_writes(values: list[bytes]) -> None:
    packed = PackedBytes.from_values(values)
    assert packed.to_json() == bytes_json(values)
    assert orjson.loads(packed.to_json()) == [v.decode("utf-8", "replace") for v in values]
    assert packed.to_raw() == _raw(values)


@pytest.mark.parametrize(
    ("raw", "count", "message"),
    [
        (b"\x02\x00\x00\x00ab\x05\x00\x00\x00a", 2, "raw BYTES element 1 is truncated"),
        (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00", 2, "1 bytes left over after 2 BYTES elements"),
        (b"\x01\x00\x00\x00abcd", 2, "raw BYTES data ends after 1 of 2 elements"),
        (b"\x00\x00\x00\x00", 2, "2 raw BYTES elements need at least 8 bytes"),
    ],
)
def test_raw_faults_name_the_tensor(raw: bytes, count: int, message: str) -> None:
    with pytest.raises(BadInput, match=f"input 'x': {message}"):
        PackedBytes.from_raw("x", raw, count)


def test_a_tensor_stays_packed_until_a_model_reads_data() -> None:
    values = [b"ab", b"", b"\xff"] * 2
    tensor = tensor_from_raw("INPUT0", "BYTES", [2, 3], _raw(values))
    assert tensor.packed is not None and tensor.size == 6
    echoed = tensor.renamed("OUTPUT0")
    assert echoed.packed is tensor.packed and echoed.shape == (2, 3)
    assert tensor_to_raw(echoed) == _raw(values)
    assert orjson.loads(orjson.dumps(tensor_to_json(echoed)))["data"] == orjson.loads(bytes_json(values))
    data = tensor.data  # now the object array models know, made once
    assert data.dtype == object and data.shape == (2, 3) and data.reshape(-1).tolist() == values
    assert tensor.packed is None and tensor.data is data
    assert tensor == Tensor("INPUT0", (2, 3), "BYTES", np.array(values, dtype=object).reshape(2, 3))
    assert echoed.packed is not None  # the other holder still has it packed


@given(st.lists(st.binary(max_size=5), max_size=30), st.binary(max_size=3))
def test_elements_spread_through_a_buffer_encode_as_packed_end_to_end(
    values: list[bytes], gap: bytes
) -> None:
    # as jsonpacked makes them: each element between two quotes of the body, in order
    buffer = bytearray(b"[")
    starts, ends = [], []
    for value in values:
        buffer += gap + b'"'
        starts.append(len(buffer))
        buffer += value
        ends.append(len(buffer))
        buffer += b'",'
    packed = PackedBytes(bytes(buffer), np.array(starts, np.uint32), np.array(ends, np.uint32))
    assert list(packed) == values
    assert packed.to_raw() == _raw(values)
    assert packed.to_json() == bytes_json(values)
    texts = [v for v in values if b'"' not in v and b"\\" not in v and all(c >= 0x20 for c in v)]
    texts = [v for v in texts if _utf8(v)]
    text = PackedBytes.from_values(texts)
    text.text = True  # as jsonpacked marks elements it read as JSON text
    assert text.to_json() == bytes_json(texts)


def _utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True
