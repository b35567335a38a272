"""An OIP request body parsed with its large BYTES ``data`` arrays packed, never a Python
``str`` per element.

orjson turns a JSON string into a ``str`` (50 bytes and more) and sizes its document
tree from the body's length: a body of a million ``"ab",`` (5 bytes each) peaks at 24
times its size inside ``orjson.loads``. :func:`loads_packed` finds each ``"data":`` array
of strings on the bytes first (regular expressions and numpy, in C), checks it is a
well-formed JSON array of strings nested at most ``MAX_DIMS`` deep, and hands orjson the
body with that array cut out; the tensor's ``data`` is then a
:class:`~actorserve.packedbytes.PackedBytes` whose buffer is the body itself (elements
without escapes), or one buffer of the decoded elements (any escape: each element with
one decoded by orjson on its own). Anything that is not such an array is left to orjson,
so every body parses to what ``orjson.loads`` gives, or fails as it fails (a packed
array's own fault is a :class:`BadInput` saying the body is not valid JSON). No I/O.
"""

from __future__ import annotations

import array
import codecs
import re
import secrets
from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from .errors import BadInput
from .limits import MAX_DIMS
from .packedbytes import PackedBytes

__all__ = ["PACKED_MIN_ELEMENTS", "NumberText", "loads_packed"]

#: ``data`` arrays of at least this many strings are packed; smaller ones parse as before
PACKED_MIN_ELEMENTS: Final = 1024
#: bodies shorter than this cannot hold such an array worth the scan
_MIN_BODY: Final = 4 * PACKED_MIN_ELEMENTS

_WS = rb"[ \t\n\r]"
_STRING = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
#: a ``"data"`` key and the ``[`` opening its value (a ``"`` inside a JSON string is
#: escaped, so both quotes here delimit a real string: it is a key)
_DATA_KEY: Final = re.compile(rb'"data"' + _WS + rb"*:" + _WS + rb"*\[")
#: strings, brackets, commas and white space: an array of strings and what may follow
#: it up to the next key (a string followed by ``:`` ends the run). Possessive: no
#: backtracking state is kept per element
_RUN: Final = re.compile(rb"(?:[ \t\n\r\[\],]++|" + _STRING + rb"(?!" + _WS + rb"*:))*+")
_STRINGS: Final = re.compile(_STRING)
_ESCAPE_OR_CONTROL: Final = re.compile(rb"[\\\x00-\x1f]")
_NON_ASCII: Final = re.compile(rb"[\x80-\xff]")
_CHUNK: Final = 1 << 20

# token codes of the gap grammar: [ ] , and a string
_CODES = np.zeros(256, np.uint8)
_CODES[ord("[")], _CODES[ord("]")], _CODES[ord(",")], _CODES[ord('"')] = 0, 1, 2, 3
#: which token may follow which: ``[`` -> ``[ ] "``; ``]`` and ``"`` -> ``] ,``; ``,`` -> ``[ "``
_FOLLOWS = np.zeros(16, bool)
for _a, _b in ((0, 0), (0, 1), (0, 3), (1, 1), (1, 2), (3, 1), (3, 2), (2, 0), (2, 3)):
    _FOLLOWS[_a * 4 + _b] = True


def loads_packed(body: bytes) -> Any:
    """``orjson.loads(body)``, with every ``"data"`` value that is an array of at least
    :data:`PACKED_MIN_ELEMENTS` strings (nested arrays flattened, row-major) as a
    :class:`PackedBytes` of their UTF-8 bytes, and every one of as many numbers (or
    ``true`` / ``false``) as a :class:`NumberText`, when it is the ``data`` of an object
    in the top-level ``inputs`` list (anywhere else it is the list orjson makes). Raises
    ``orjson.JSONDecodeError`` as orjson does, :class:`BadInput` for a string of a packed
    array that is not valid (an escape, UTF-8); a number's own fault is found when the
    codecs read the :class:`NumberText`."""
    if len(body) < _MIN_BODY:
        return orjson.loads(body)
    regions: list[tuple[int, int, PackedBytes | NumberText]] = []
    for match in _DATA_KEY.finditer(body):
        start = match.end() - 1
        if regions and start < regions[-1][1]:
            continue
        first = _FIRST_VALUE.match(body, start)
        if first is not None and body[first.end() - 1 : first.end()] == b'"':
            region: tuple[int, int, PackedBytes | NumberText] | None = _region(body, start)
        else:
            region = _numbers(body, start)
        if region is not None:
            regions.append(region)
    if not regions:
        return orjson.loads(body)
    nonce = secrets.token_hex(8)
    parts: list[bytes] = []
    previous = 0
    for index, (start, end, _) in enumerate(regions):
        parts += (body[previous:start], b'"', nonce.encode(), b":%d" % index, b'"')
        previous = end
    parts.append(body[previous:])
    obj = orjson.loads(b"".join(parts))
    del parts
    markers = {f"{nonce}:{i}": value for i, (_, _, value) in enumerate(regions)}
    placed = 0
    inputs = obj.get("inputs") if isinstance(obj, dict) else None
    for tensor in inputs if isinstance(inputs, list) else ():
        if isinstance(tensor, dict):
            data = tensor.get("data")
            if isinstance(data, str) and data in markers:
                tensor["data"] = markers[data]
                placed += 1
    if placed < len(markers):  # a "data" key elsewhere (a parameter): the list back
        texts = {f"{nonce}:{i}": body[s:e] for i, (s, e, _) in enumerate(regions)}
        _restore(obj, texts)
    return obj


class NumberText:
    """The numbers of a JSON ``data`` array, as their text (brackets and white space
    gone: ``1,2,3``), read a slice at a time by :meth:`chunks` so that no list of every
    value is ever built (:func:`actorserve.codecs.tensor_from_list` converts each to the
    tensor's datatype). ``count``: how many values there are."""

    __slots__ = ("count", "text")

    def __init__(self, text: bytes, count: int) -> None:
        self.text = text
        self.count = count

    def __len__(self) -> int:
        return self.count

    def chunks(self) -> Iterator[list[Any]]:
        """The values, a list of about :data:`_CHUNK` / 4 bytes of text at a time;
        :class:`BadInput` for text that is not JSON numbers."""
        text, start = self.text, 0
        while start < len(text):
            stop = text.find(b",", start + _NUMBER_CHUNK)
            stop = len(text) if stop < 0 else stop
            try:
                values = orjson.loads(b"[" + text[start:stop] + b"]")
            except orjson.JSONDecodeError as exc:
                raise BadInput(f"the request body is not valid JSON: {exc}") from None
            yield values
            start = stop + 1


#: bytes of number text parsed at once (orjson holds the GIL a millisecond or so)
_NUMBER_CHUNK: Final = 1 << 18
#: the first value of an array (past its brackets, and commas between empty ones)
_FIRST_VALUE: Final = re.compile(rb"[ \t\n\r\[\],]*+.")
#: bytes an array of numbers (and true, false) is made of
_NUMBER_BYTES = np.zeros(256, bool)
_NUMBER_BYTES[np.frombuffer(b" \t\n\r[],0123456789+-.eEtruefals", np.uint8)] = True
_STRUCTURE = np.zeros(256, np.uint8)  # 1 white space, 2 a bracket or comma, 0 a value's byte
_STRUCTURE[np.frombuffer(b" \t\n\r", np.uint8)] = 1
_STRUCTURE[np.frombuffer(b"[],", np.uint8)] = 2


def _numbers(body: bytes, start: int) -> tuple[int, int, NumberText] | None:
    """The array of numbers opening at ``start``: (start, end, its text), or None if it
    is not one worth reading in slices. Found and checked by numpy a megabyte at a time
    (numpy lets other threads run meanwhile): the array is where the bytes of numbers,
    brackets and commas run, the values are the runs between them, and the tokens must
    follow the grammar of nested arrays as for strings."""
    view = np.frombuffer(body, np.uint8)
    end, window = start, 4096  # a window that grows: a small array costs its own size
    while end < len(body):  # up to the first byte that is none of those
        outside = np.flatnonzero(~_NUMBER_BYTES[view[end : end + window]])
        if outside.size:
            end += int(outside[0])
            break
        end += min(window, len(body) - end)
        window = min(2 * window, _CHUNK)
    while end > start and body[end - 1] in b" \t\n\r,":  # what follows the array
        end -= 1
    if end - start < 2 * PACKED_MIN_ELEMENTS or body[end - 1] != ord("]"):
        return None
    kinds = _STRUCTURE[view[start:end]]
    value = kinds == 0
    firsts = value.copy()
    firsts[1:] &= ~value[:-1]  # a value's first byte
    count = int(np.count_nonzero(firsts))
    if count < PACKED_MIN_ELEMENTS:
        return None
    keep = (kinds == 2) | firsts
    del kinds, value
    tokens = view[start:end][keep]
    tokens[firsts[keep]] = ord('"')  # each value stands as one token, as a string does
    del firsts, keep
    if not _well_formed_tokens(tokens.tobytes(), regular=True):
        return None
    text = body[start:end].translate(None, b"[] \t\n\r")
    if b",," in text or text[:1] == b"," or text[-1:] == b",":  # an empty array inside
        text = re.sub(rb",,+", b",", text).strip(b",")
    return start, end, NumberText(text, count)


def _region(body: bytes, start: int) -> tuple[int, int, PackedBytes] | None:
    """The array of strings opening at ``start``: (start, end, its elements), or None if
    it is not one worth packing (orjson then parses it, or refuses the body)."""
    end = _run_end(body, start)
    while end > start and body[end - 1] in b" \t\n\r,":  # what follows the array
        end -= 1
    quotes = body.count(b'"', start, end)
    if quotes < 2 * PACKED_MIN_ELEMENTS or body[end - 1] != ord("]"):
        return None
    if _ESCAPE_OR_CONTROL.search(body, start, end) is None:
        # every quote delimits a string: the elements are where they stand in the body
        places = _quote_places(body, start, end, quotes)
        if not _well_formed(body, start, end, places[0::2], places[1::2]):
            return None
        if _NON_ASCII.search(body, start, end) is not None and not _utf8(body, start, end):
            raise BadInput("the request body is not valid JSON: a string is not valid UTF-8")
        places[0::2] += 1  # an element starts after its opening quote
        return start, end, PackedBytes(body, places[0::2], places[1::2], text=True)
    opens, closes, packed = _decoded(body, start, end)
    if not _well_formed(body, start, end, opens, closes):
        return None
    return start, end, packed


def _run_end(body: bytes, start: int) -> int:
    """Where :data:`_RUN` from ``start`` ends, matched a window at a time: the regular
    expression holds the GIL while it runs, so a megabyte in one match would stall every
    other thread (a health probe's) for tens of milliseconds. A window never ends just
    after a quote or white space, so no string ends at its edge with a key's ``:``
    beyond it unseen; a match that stops short is tried again from there, with a wider
    window if it made no way. A small array costs its own length, not a window's."""
    position, size, window = start, len(body), _RUN_WINDOW
    while True:
        edge = min(size, position + window)
        while edge < size and body[edge - 1] in b'" \t\n\r':
            edge += 1
        match = _RUN.match(body, position, edge)
        assert match is not None  # the pattern matches the empty string
        if edge >= size:
            return match.end()
        if match.end() > position:
            position, window = match.end(), _RUN_WINDOW
        else:  # a token longer than the window, or the run's end
            window *= 2


#: bytes the run of an array is matched in at once
_RUN_WINDOW: Final = 1 << 18


def _quote_places(body: bytes, start: int, end: int, quotes: int) -> npt.NDArray[Any]:
    """Where each of the ``quotes`` quotes of ``body[start:end]`` is, a chunk at a time."""
    places = np.empty(quotes, np.uint32 if len(body) < 2**32 else np.uint64)
    view = np.frombuffer(body, np.uint8, count=end - start, offset=start)
    filled = 0
    for first in range(0, end - start, _CHUNK):
        found = np.flatnonzero(view[first : first + _CHUNK] == ord('"'))
        places[filled : filled + found.size] = found + (start + first)
        filled += found.size
    return places


def _well_formed(
    body: bytes, start: int, end: int, opens: npt.NDArray[Any], closes: npt.NDArray[Any]
) -> bool:
    """Whether ``body[start:end]``, whose strings open and close at ``opens`` and
    ``closes``, is one JSON array of strings (arrays of them nested at most ``MAX_DIMS``
    deep): each string stands as its opening quote, white space goes, and the tokens
    left must follow the grammar with their brackets balanced."""
    size = end - start
    # +1 from each string's first byte to past its closing quote: 0 marks what is kept
    steps = np.zeros(size + 1, np.int8)
    for first in range(0, len(opens), _CHUNK):
        steps[opens[first : first + _CHUNK].astype(np.intp) + (1 - start)] += 1
        steps[closes[first : first + _CHUNK].astype(np.intp) + (1 - start)] -= 1
    inside = np.cumsum(steps[:size], dtype=np.int8)
    del steps
    view = np.frombuffer(body, np.uint8, count=size, offset=start)
    tokens = view[inside == 0].tobytes().translate(None, b" \t\n\r")
    del inside
    return _well_formed_tokens(tokens)


def _well_formed_tokens(tokens: bytes, *, regular: bool = False) -> bool:
    """Whether ``tokens`` (``[``, ``]``, ``,`` and ``"`` for each value) is one array of
    values nested at most ``MAX_DIMS`` deep; ``regular``: and one numpy makes an array
    of (every value as deep, every list of a level as long: numpy refuses a ragged one).
    Depths are counted on the brackets alone (a value or comma between them is a byte
    of memory here, not an integer)."""
    codes = _CODES[np.frombuffer(tokens, np.uint8)]
    if codes.size < 2 or codes[0] != 0 or codes[-1] != 1:
        return False
    for first in range(0, codes.size - 1, _CHUNK):  # which token may follow which
        stop = min(first + _CHUNK, codes.size - 1)
        pairs = codes[first:stop] * 4
        pairs += codes[first + 1 : stop + 1]
        if not _FOLLOWS[pairs].all():
            return False
    brackets = np.flatnonzero(codes <= 1)  # [ is 0, ] is 1
    closes = codes[brackets].astype(np.int32)
    depth = np.cumsum(1 - 2 * closes, dtype=np.int32)  # after each bracket
    if not (depth[-1] == 0 and depth[:-1].min(initial=1) >= 1 and depth.max() <= MAX_DIMS):
        return False
    if not regular:
        return True
    gaps = np.diff(brackets) - 1  # tokens between one bracket and the next
    kind = closes[:-1] * 2 + closes[1:]  # 0 [[, 1 [], 2 ][, 3 ]]
    innermost = kind == 1
    if (gaps[kind == 2] != 1).any() or (gaps[(kind == 0) | (kind == 3)] != 0).any():
        return False  # a value beside a list
    lengths = (gaps[innermost] + 1) // 2
    deepest = depth[:-1][innermost]
    if lengths.min() != lengths.max() or deepest.min() != deepest.max():
        return False
    opens = closes == 0
    for outer in range(1, int(deepest[0])):  # each list of a level holds as many lists
        lists = np.flatnonzero(opens & (depth == outer))
        children = np.flatnonzero(opens & (depth == outer + 1))
        counts = np.diff(np.searchsorted(children, lists), append=len(children))
        if counts.min() != counts.max():
            return False
    return True


def _decoded(body: bytes, start: int, end: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any], PackedBytes]:
    """Where the strings of ``body[start:end]`` open and close, and their elements, of
    which some hold escapes: each such one decoded by orjson, into one buffer (a step of
    Python an element, one ``str`` at a time)."""
    buffer = bytearray()
    opens, closes = array.array("Q"), array.array("Q")
    starts, ends = array.array("Q"), array.array("Q")
    plain = _ESCAPE_OR_CONTROL.search
    for match in _STRINGS.finditer(body, start, end):
        opens.append(match.start())
        closes.append(match.end() - 1)
        starts.append(len(buffer))
        text = match.group()
        if plain(text, 1, len(text) - 1) is None and (text.isascii() or _utf8(text, 0, len(text))):
            buffer += text[1:-1]
        else:
            try:
                buffer += orjson.loads(text).encode()
            except orjson.JSONDecodeError as exc:
                raise BadInput(f"the request body is not valid JSON: {exc}") from None
        ends.append(len(buffer))
    packed = PackedBytes(bytes(buffer), np.frombuffer(starts, np.uint64), np.frombuffer(ends, np.uint64))
    return np.frombuffer(opens, np.uint64), np.frombuffer(closes, np.uint64), packed


def _utf8(body: bytes, start: int, end: int) -> bool:
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    try:
        for first in range(start, end, _CHUNK):
            decoder.decode(view[first : min(first + _CHUNK, end)])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _restore(obj: Any, texts: dict[str, bytes]) -> None:
    """Put back, as orjson parses it, each cut array that was not an input's ``data``."""
    stack: list[Any] = [obj]
    while stack:
        value = stack.pop()
        items: Any = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in list(items):
            if isinstance(item, str) and item in texts:
                value[key] = orjson.loads(texts[item])
            elif isinstance(item, (dict, list)):
                stack.append(item)
