"""BYTES tensor elements kept as one buffer with offsets, never a Python object each.

A ``bytes`` of two bytes costs 35 bytes of memory and its pointer 8 more, while on the
wire it may take five (``"ab",``): a request of a million short strings decoded into
objects costs ten times its size, and a process that decodes it twice (a front: the
request, then the echoed answer) twenty. :class:`PackedBytes` holds the elements as
they arrived, one buffer (the request body, the raw tensor bytes) and two offset arrays
of 4 bytes an element, and is read as a sequence of ``bytes`` one element at a time.
A :class:`~actorserve.types.Tensor` holds one where a decoder made it, and turns it into
the numpy object array models know only when ``Tensor.data`` is read; the encoders
(raw bytes, OIP JSON, the engine link) read it as it is. No I/O; decoders raise
:class:`~actorserve.errors.BadInput` naming the tensor.
"""

from __future__ import annotations

import array
import re
import struct
from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from .errors import BadInput

__all__ = ["PackedBytes"]

_LEN: Final = struct.Struct("<I")
#: elements turned into Python values at once while iterating (a list of this many)
_CHUNK: Final = 4096
#: bytes a JSON string may hold as it is (no escape to write, nothing to check)
_JSON_PLAIN: Final = re.compile(rb'[^"\\\x00-\x1f]*')


def _offsets(values: array.array[int]) -> npt.NDArray[Any]:
    """An ``array.array`` of offsets as a numpy array sharing its memory."""
    return np.frombuffer(values, dtype=np.uint32 if values.typecode == "I" else np.uint64)


def _offset_array(size: int, count: int) -> array.array[int]:
    """``count`` zero offsets, each wide enough for a buffer of ``size`` bytes."""
    return array.array("I" if size < 2**32 else "Q", [0]) * count


class PackedBytes:
    """The elements of a BYTES tensor: element ``i`` is ``buffer[starts[i]:ends[i]]``.

    Immutable once built; whoever built it hands it over (``buffer`` is not copied).
    ``raw``: ``buffer`` is exactly these elements in Triton's raw layout (each a 4-byte
    little-endian length, then its bytes), so encoding them raw is ``buffer`` itself.
    ``text``: each element is UTF-8 that JSON holds as it is (no quote, backslash or
    control character: JSON text's strings without escapes), so JSON copies it.
    """

    __slots__ = ("buffer", "ends", "raw", "starts", "text")

    def __init__(
        self,
        buffer: bytes,
        starts: npt.NDArray[Any],
        ends: npt.NDArray[Any],
        *,
        raw: bool = False,
        text: bool = False,
    ) -> None:
        self.buffer = buffer
        self.starts = starts
        self.ends = ends
        self.raw = raw
        self.text = text

    # -- building ----------------------------------------------------------------------

    @classmethod
    def from_raw(cls, name: str, data: bytes, count: int) -> PackedBytes:
        """``count`` elements in Triton's raw layout, which must fill ``data`` exactly.
        Each length is read once (a step of Python an element: no object is kept)."""
        unpack = _LEN.unpack_from
        size = len(data)
        if count * 4 > size:  # each element takes its length at least: refused unsized
            raise BadInput(
                f"input {name!r}: {count} raw BYTES elements need at least {count * 4} bytes, got {size}"
            )
        # sized once (count is at most a quarter of the length, checked above): appending
        # would copy each array as it grows
        starts, ends = _offset_array(size, count), _offset_array(size, count)
        pos = 0
        for i in range(count):
            if pos + 4 > size:
                raise BadInput(f"input {name!r}: raw BYTES data ends after {i} of {count} elements")
            (length,) = unpack(data, pos)
            pos += 4
            starts[i] = pos
            pos += length
            if pos > size:
                raise BadInput(f"input {name!r}: raw BYTES element {i} is truncated")
            ends[i] = pos
        if pos != size:
            raise BadInput(f"input {name!r}: {size - pos} bytes left over after {count} BYTES elements")
        return cls(data, _offsets(starts), _offsets(ends), raw=True)

    @classmethod
    def from_values(cls, values: Any) -> PackedBytes:
        """Elements that are ``bytes`` already (any iterable of them), copied into one buffer."""
        buffer = bytearray()
        starts, ends = array.array("Q"), array.array("Q")
        for value in values:
            starts.append(len(buffer))
            buffer += value
            ends.append(len(buffer))
        return cls(bytes(buffer), np.frombuffer(starts, np.uint64), np.frombuffer(ends, np.uint64))

    # -- reading -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> bytes:
        return self.buffer[int(self.starts[index]) : int(self.ends[index])]

    def __iter__(self) -> Iterator[bytes]:
        buffer = self.buffer
        for first in range(0, len(self.starts), _CHUNK):
            starts = self.starts[first : first + _CHUNK].tolist()
            ends = self.ends[first : first + _CHUNK].tolist()
            for start, end in zip(starts, ends, strict=True):
                yield buffer[start:end]

    def __repr__(self) -> str:
        return f"PackedBytes({len(self)} elements, {len(self.buffer)} bytes)"

    @property
    def nbytes(self) -> int:
        """The memory this holds (its buffer and both offset arrays)."""
        return len(self.buffer) + self.starts.nbytes + self.ends.nbytes

    def to_numpy(self) -> npt.NDArray[Any]:
        """A flat numpy object array of the elements as ``bytes`` (one object each)."""
        return np.fromiter(iter(self), dtype=object, count=len(self))

    # -- encoding ----------------------------------------------------------------------

    def to_raw(self) -> bytes:
        """The elements in Triton's raw layout, built in one buffer (by numpy, in C)."""
        if self.raw:
            return self.buffer
        if not self._in_order():
            out = bytearray()
            pack = _LEN.pack
            for value in self:
                out += pack(len(value))
                out += value
            return bytes(out)
        array = self._framed(0, 4, 0, 0)
        for places, lengths in self._blocks(0, 4, 0, array):
            for shift in range(4):  # each element's length, little-endian, before it
                array[places + shift] = (lengths >> (8 * shift)) & 0xFF
        return array.tobytes()

    def to_json(self) -> bytes:
        """The elements as a JSON array of strings (undecodable bytes replaced), written
        into one buffer: by numpy when no element needs an escape and each is valid
        UTF-8 (ASCII, or packed from JSON text), else a step of Python each (orjson for
        an element that needs it)."""
        if not len(self):
            return b"[]"
        if self._in_order() and (self.text or self._plain_ascii()):
            array = self._framed(1, 1, 2, ord('"'))
            for places, lengths in self._blocks(1, 1, 2, array):
                array[places + lengths + 2] = ord(",")  # after each closing quote
            array[0], array[-1] = ord("["), ord("]")
            return array.tobytes()
        out = bytearray(b"[")
        plain = _JSON_PLAIN.fullmatch
        dumps = orjson.dumps
        for value in self:
            if plain(value) is not None and (value.isascii() or _utf8(value)):
                out += b'"'
                out += value
                out += b'",'
            else:
                out += dumps(value.decode("utf-8", errors="replace"))
                out += b","
        out[-1] = ord("]")
        return bytes(out)

    def _in_order(self) -> bool:
        """Whether the elements lie in the buffer in their order, none overlapping."""
        return bool((self.starts[1:] >= self.ends[:-1]).all() and (self.ends >= self.starts).all())

    def _plain_ascii(self) -> bool:
        """No byte that JSON text must escape, and all ASCII (so each element is UTF-8)."""
        for first in range(0, len(self), _BLOCK):
            content = self._content(first, first + _BLOCK)
            if ((content < 0x20) | (content >= 0x80) | (content == ord('"')) | (content == ord("\\"))).any():
                return False
        return True

    def _content(self, first: int, stop: int) -> npt.NDArray[np.uint8]:
        """The bytes of elements ``first`` to ``stop`` (in order), as one array (a view
        of the buffer when they lie end to end)."""
        starts, ends = self.starts[first:stop], self.ends[first:stop]
        begin, end = int(starts[0]), int(ends[-1])
        view = np.frombuffer(self.buffer, np.uint8, count=end - begin, offset=begin)
        if np.array_equal(starts[1:], ends[:-1]):
            return view
        steps = np.zeros(end - begin + 1, np.int8)
        steps[starts.astype(np.intp) - begin] += 1
        steps[ends.astype(np.intp) - begin] -= 1
        return view[np.cumsum(steps[:-1], dtype=np.int8).view(np.bool_)]

    def _framed(self, lead: int, before: int, after: int, fill: int) -> npt.NDArray[np.uint8]:
        """An array for ``lead`` bytes, then each element with ``before`` bytes in
        front of it and ``after`` behind, all ``fill``."""
        total = int(np.sum(self.ends, dtype=np.int64) - np.sum(self.starts, dtype=np.int64))
        return np.full(lead + len(self) * (before + after) + total, fill, np.uint8)

    def _blocks(
        self, lead: int, before: int, after: int, array: npt.NDArray[np.uint8]
    ) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """Copy the elements into ``array`` (from :meth:`_framed`) a block at a time
        (what numpy holds beside it stays a block's); yield each block's places (where
        each element's ``before`` bytes are) and lengths, for the caller to frame."""
        position = lead
        for first in range(0, len(self), _BLOCK):
            starts = self.starts[first : first + _BLOCK].astype(np.int64)
            lengths = self.ends[first : first + _BLOCK].astype(np.int64) - starts
            places = np.arange(len(starts), dtype=np.int64) * (before + after) + position
            places[1:] += np.cumsum(lengths[:-1])
            size = len(starts) * (before + after) + int(lengths.sum())
            steps = np.zeros(size + 1, np.int8)
            steps[places - position + before] += 1
            steps[places - position + before + lengths] -= 1
            inside = np.cumsum(steps[:-1], dtype=np.int8).view(np.bool_)
            del steps
            array[position : position + size][inside] = self._content(first, first + _BLOCK)
            yield places, lengths
            position += size


#: elements encoded at once (numpy's arrays beside the answer hold a block's)
_BLOCK: Final = 1 << 16


def _utf8(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False
    return True
