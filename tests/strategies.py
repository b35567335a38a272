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
        return dt, np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), dtype=bool).reshape(shape)
    dtype = DATATYPES[dt]
    if dtype.kind == "f":
        values = draw(st.lists(st.floats(width=dtype.itemsize * 8, allow_nan=False), min_size=size, max_size=size))
    else:
        info = np.iinfo(dtype)
        values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=size, max_size=size))
    return dt, np.array(values, dtype=dtype).reshape(shape)
