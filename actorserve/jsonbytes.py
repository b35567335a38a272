"""BYTES tensors to and from OIP JSON at a bounded cost per element.

A JSON string is a Python ``str`` (50 bytes and more) once orjson has parsed it, and a
BYTES element is a ``bytes`` (33 and more): a request of short strings is mostly object
headers. :func:`bytes_array` therefore converts a parsed ``data`` list in place, each
``str`` replaced by its ``bytes`` as it is read (the ``str`` freed before the next one is
made), and :func:`bytes_json` writes an answer's elements as JSON text into one buffer,
never a list of ``str``. No I/O; errors are :class:`BadInput` naming the tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from .errors import BadInput
from .limits import MAX_DIMS

__all__ = ["BYTES_FRAGMENT_ELEMENTS", "bytes_array", "bytes_element", "bytes_json", "bytes_to_text"]

#: BYTES tensors of more elements are written as JSON text at once (an orjson Fragment)
BYTES_FRAGMENT_ELEMENTS: Final = 1024


def bytes_element(name: str, value: object) -> bytes:
    """One element of a BYTES tensor's JSON ``data``: a string (UTF-8) or bytes."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise BadInput(f"input {name!r}: BYTES elements must be strings, got {type(value).__name__} {value!r}")


def bytes_to_text(value: object) -> str:
    """One BYTES element as JSON text (undecodable bytes replaced)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def bytes_array(name: str, data: list[Any], expected: int) -> tuple[npt.NDArray[Any], int]:
    """The leaves of nested lists ``data`` (row-major) as an object array of ``expected``
    ``bytes``, and how many leaves there are (the caller refuses a count that is not
    ``expected``; leaves past it are counted, not converted). Each ``str`` is replaced by
    its ``bytes`` in its own list. Iterative, at most ``MAX_DIMS`` lists deep."""
    array = np.empty(expected, dtype=object)
    count = 0
    stack: list[tuple[list[Any], int]] = [(data, 0)]
    while stack:
        items, start = stack[-1]
        for i in range(start, len(items)):
            item = items[i]
            if isinstance(item, list):
                if len(stack) >= MAX_DIMS:
                    raise BadInput(f"input {name!r}: data is nested more than {MAX_DIMS} lists deep")
                stack[-1] = (items, i + 1)
                stack.append((item, 0))
                break
            if count < expected:
                items[i] = value = bytes_element(name, item)
                array[count] = value
            count += 1
        else:
            stack.pop()
    return array, count


def bytes_json(values: Iterable[object]) -> bytes:
    """BYTES elements as a JSON array of strings, written into one buffer: a list of
    ``str`` first would hold 50 bytes and more per element, where the text may take 3."""
    out = bytearray(b"[")
    dumps = orjson.dumps
    for value in values:
        out += dumps(bytes_to_text(value))
        out += b","
    if len(out) > 1:
        out[-1] = ord("]")
    else:
        out += b"]"
    return bytes(out)
