"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from actorserve.types import DATATYPES

datatypes = st.sampled_from(sorted(DATATYPES))
shapes = st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=3).map(tuple)


@st.composite
def arrays(draw: st.DrawFn, datatype: str | None = None) -> tuple[str, np.ndarray[Any, Any]]:
    """(datatype, array) pairs covering every OIP datatype."""
    dt = datatype or draw(datatypes)
    shape = draw(shapes)
    size = int(np.prod(shape)) if shape else 1
    if dt == "BYTES":
        values = draw(st.lists(st.binary(max_size=8), min_size=size, max_size=size))
        out = np.empty(size, dtype=object)
        out[:] = values
        return dt, out.reshape(shape)
    if dt == "BOOL":
        return dt, np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool).reshape(
            shape
        )
    dtype = DATATYPES[dt]
    if dtype.kind == "f":
        values = draw(
            st.lists(st.floats(width=dtype.itemsize * 8, allow_nan=False), min_size=size, max_size=size)
        )
    else:
        info = np.iinfo(dtype)
        values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=size, max_size=size))
    return dt, np.array(values, dtype=dtype).reshape(shape)


# -- garbage, for the bad-input tests (tests/reliability/test_rel_badinput_codecs.py) ---

#: JSON scalars, including integers past 64 bits and strings that look like datatypes
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(sorted(DATATYPES)),
)
#: any JSON value, small
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
#: what a shape might be sent as
shape_like = st.one_of(
    st.lists(st.integers(-3, 6), max_size=3), st.lists(st.integers(-(2**64), 2**64), max_size=2), json_values
)


@st.composite
def oip_tensor_like(draw: st.DrawFn) -> dict[str, Any]:
    """An input or output object of an OIP JSON body: each field valid-looking or not."""
    obj: dict[str, Any] = {}
    if draw(st.booleans()):
        obj["name"] = draw(st.one_of(st.text(max_size=4), json_values))
    if draw(st.booleans()):
        obj["datatype"] = draw(st.one_of(datatypes, st.text(max_size=5), json_values))
    if draw(st.booleans()):
        obj["shape"] = draw(shape_like)
    if draw(st.booleans()):
        obj["data"] = draw(st.one_of(json_values, st.lists(json_scalars, max_size=6)))
    if draw(st.booleans()):
        obj["parameters"] = draw(
            st.one_of(
                json_values,
                st.fixed_dictionaries(
                    {}, optional={"binary_data_size": json_scalars, "binary_data": json_scalars}
                ),
            )
        )
    return obj


@st.composite
def oip_request_like(draw: st.DrawFn) -> Any:
    """An OIP infer body that is often almost right, sometimes anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    obj: dict[str, Any] = {}
    if draw(st.booleans()):
        obj["id"] = draw(json_values)
    if draw(st.booleans()):
        obj["parameters"] = draw(json_values)
    obj["inputs"] = draw(st.one_of(st.lists(oip_tensor_like(), max_size=3), json_values))
    if draw(st.booleans()):
        obj["outputs"] = draw(st.one_of(st.lists(oip_tensor_like(), max_size=2), json_values))
    return obj


#: msgpack-able values, small (what a broken peer might put in a message's fields)
msgpack_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=6),
        st.binary(max_size=12),
    ),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=14,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position in a tree of lists and dicts (the root included)."""
    found = [prefix]
    if isinstance(value, list):
        for k, item in enumerate(value):
            found += _paths(item, (*prefix, k))
    elif isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [_replace(v, rest, new) if k == head else v for k, v in enumerate(value)]
    return {k: _replace(v, rest, new) if k == head else v for k, v in value.items()}


@st.composite
def mutated(draw: st.DrawFn, valid: Any, replacements: st.SearchStrategy[Any], max_changes: int = 3) -> Any:
    """``valid`` (a tree of lists and dicts) with up to ``max_changes`` nodes replaced by
    values drawn from ``replacements``, or a list cut short: input that is nearly right,
    which reaches deeper into a decoder than random bytes do."""
    value = valid
    for _ in range(draw(st.integers(1, max_changes))):
        path = draw(st.sampled_from(_paths(value)))
        node = value
        for key in path:
            node = node[key]
        if isinstance(node, list) and node and draw(st.booleans()):
            value = _replace(value, path, node[: draw(st.integers(0, len(node) - 1))])
        else:
            value = _replace(value, path, draw(replacements))
    return value
