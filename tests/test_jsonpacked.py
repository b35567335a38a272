"""OIP bodies whose large BYTES ``data`` arrays are parsed packed: the same values as
``orjson.loads`` (or the same refusal), at a bounded cost in memory."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorserve import jsonpacked
from actorserve.codecs import request_from_json
from actorserve.errors import BadInput
from actorserve.jsonpacked import PACKED_MIN_ELEMENTS, NumberText, loads_packed
from actorserve.packedbytes import PackedBytes

N = PACKED_MIN_ELEMENTS


def _body(data: Any, *, indent: int | None = None, ascii: bool = False, **more: Any) -> bytes:
    tensor = {"name": "INPUT0", "shape": [N], "datatype": "BYTES", "data": data, **more}
    return json.dumps({"id": "x", "inputs": [tensor]}, indent=indent, ensure_ascii=ascii).encode()


def _flat(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return [value]
    return [leaf for item in value for leaf in _flat(item)]


def _plain(value: Any) -> Any:
    """``loads_packed``'s answer with each PackedBytes as the list of its texts."""
    if isinstance(value, PackedBytes):
        return ("packed", [v.decode() for v in value])
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _expected(body: bytes) -> Any:
    """``orjson.loads(body)`` with each input's data of strings flattened and packed."""
    obj = orjson.loads(body)
    for tensor in obj["inputs"]:
        leaves = _flat(tensor["data"])
        if len(leaves) >= N and all(isinstance(v, str) for v in leaves):
            tensor["data"] = ("packed", leaves)
    return obj


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=4)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(texts, min_size=N, max_size=N + 10),
    st.sampled_from(["flat", "pairs", "ragged"]),
    st.sampled_from([None, 1]),
    st.booleans(),
    st.sampled_from([1, 7, 1 << 18]),
)
def test_the_same_values_as_orjson(
    strings: list[str], nesting: str, indent: int | None, ascii: bool, window: int
) -> None:
    if nesting == "pairs":
        data: list[Any] = [strings[i : i + 2] for i in range(0, len(strings), 2)]
    elif nesting == "ragged":
        data = [[], strings[:3], *strings[3:], [[strings[0]]]]
    else:
        data = strings
    body = _body(data, indent=indent, ascii=ascii, parameters={"data": strings})
    with pytest.MonkeyPatch.context() as patch:  # windows that end anywhere in the array
        patch.setattr(jsonpacked, "_RUN_WINDOW", window)
        assert _plain(loads_packed(body)) == _expected(body)


def test_elements_without_escapes_are_read_where_they_stand() -> None:
    body = _body(["ab"] * N)
    packed = loads_packed(body)["inputs"][0]["data"]
    assert isinstance(packed, PackedBytes) and packed.buffer is body
    assert list(packed) == [b"ab"] * N


def test_small_arrays_and_other_data_parse_as_before() -> None:
    small = _body(["ab"] * 10 + [[]] * (N - 10))
    assert loads_packed(small) == orjson.loads(small)
    few = _body([0] * (N - 1))
    assert loads_packed(few) == orjson.loads(few)
    elsewhere = json.dumps({"inputs": [], "parameters": {"data": ["ab"] * N}}).encode()
    assert loads_packed(elsewhere) == orjson.loads(elsewhere)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"ab"', b'"a\x01b"'),  # a control character in a string
        (b'"ab"', b'"a\nb"'),
        (b'"ab"', b'"a\\qb"'),  # no such escape
        (b'"ab"', b'"a\xc3"'),  # not UTF-8
        (b'"ab"', b'"\\ud800"'),  # a lone surrogate
        (b'"ab"]', b'"ab",]'),
        (b'"ab"]', b'"ab"]]'),
        (b'"ab", "ab"', b'"ab" "ab"'),
        (b'"ab", "ab"', b'"ab""ab"'),
        (b'"ab", "ab"', b'"ab",\x0b"ab"'),  # not JSON white space
    ],
)
def test_what_orjson_refuses_is_refused(old: bytes, new: bytes) -> None:
    body = _body(["ab"] * N).replace(old, new, 1)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    with pytest.raises((orjson.JSONDecodeError, BadInput)):
        loads_packed(body)


def test_nested_deeper_than_any_shape_is_left_to_the_codecs() -> None:
    body = _body([[[["ab"] * N]]])
    assert isinstance(loads_packed(body)["inputs"][0]["data"], PackedBytes)
    deep: Any = ["ab"] * N
    for _ in range(70):
        deep = [deep]
    body = _body(deep)
    assert loads_packed(body) == orjson.loads(body)  # the codecs refuse it, naming MAX_DIMS


def test_a_million_short_strings_cost_a_few_times_their_size() -> None:
    body = (
        b'{"inputs":[{"name":"I","shape":[1000000],"datatype":"BYTES","data":['
        + b",".join([b'"ab"'] * 1_000_000)
        + b"]}]}"
    )
    tracemalloc.start()
    try:
        packed = loads_packed(body)["inputs"][0]["data"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(packed) == 1_000_000
    assert peak < 8 * len(body)  # orjson.loads peaks at 24 times


def _decoded(body: bytes, parse: Any) -> Any:
    """What the codecs make of ``body`` parsed by ``parse``: the tensor, or the refusal."""
    try:
        tensor = request_from_json(parse(body)).inputs[0]
    except (BadInput, orjson.JSONDecodeError):
        return "refused"
    return tensor.shape, tensor.data.dtype, tensor.data.tolist()


numbers = st.one_of(st.integers(-3, 300), st.sampled_from([2**63, -(2**63), 1.5, -2e3, True, False]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(numbers, min_size=N, max_size=N + 4),
    st.sampled_from(["INT64", "INT8", "UINT64", "FP32", "BOOL", "BYTES"]),
    st.sampled_from(["flat", "wrapped", "pairs", "ragged", "empty first"]),
    st.booleans(),
)
def test_numbers_decode_as_from_orjson(
    values: list[Any], datatype: str, nesting: str, small_slices: bool
) -> None:
    values = values[: len(values) // 2 * 2]
    data: Any = {
        "flat": values,
        "wrapped": [[values]],
        "pairs": [values[i : i + 2] for i in range(0, len(values), 2)],
        "ragged": [values[:3], values[3:]],
        "empty first": [[], *values],
    }[nesting]
    body = json.dumps({"inputs": [{"name": "I", "shape": [len(values)], "datatype": datatype, "data": data}]})
    with pytest.MonkeyPatch.context() as patch:
        if small_slices:  # many slices, each parsed and converted on its own
            patch.setattr(jsonpacked, "_NUMBER_CHUNK", 64)
        packed = _decoded(body.encode(), loads_packed)
    assert packed == _decoded(body.encode(), orjson.loads)


def test_numbers_are_read_a_slice_at_a_time() -> None:
    body = _body([[0, 1.5], [True, -2]] * N)
    text = loads_packed(body)["inputs"][0]["data"]
    assert isinstance(text, NumberText) and len(text) == 4 * N
    assert [v for chunk in text.chunks() for v in chunk] == [0, 1.5, True, -2] * N
    ragged = _body([0, 1.5, [2], [], True] * N)  # numpy refuses it: left to orjson
    assert loads_packed(ragged) == orjson.loads(ragged)
