"""Per-request count limits, checked before anything is parsed or allocated for them.

A request's bytes are bounded by ``max_body_bytes``, but a few bytes can still stand for
many Python objects: ``[],`` is one list in three bytes (60 KiB of gzip inflated to 21 M
lists and 2.3 GB), ``{}`` one input, ``a=&`` one form field. Each limit here is far above
what a legitimate request sends and is refused with a :class:`BadInput` naming it. They
are fixed, like numpy's 64 dimensions or orjson's 1,024 nesting levels: the amount of
real data stays bounded by ``max_body_bytes``. The shape limit ``MAX_EXTENT`` lives
with the shape check in :mod:`actorserve.codecs`.

No I/O; every check is a count done in C (``bytes.count``) or on an already-built list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized
from typing import Final

from .errors import BadInput

__all__ = [
    "MAX_BYTES_ELEMENTS",
    "MAX_CHAT_MESSAGES",
    "MAX_DIMS",
    "MAX_FORM_FIELDS",
    "MAX_INPUTS",
    "MAX_JSON_CONTAINERS",
    "MAX_JSON_KEYS",
    "MAX_JSON_STRINGS",
    "MAX_JSON_VALUES",
    "MAX_PARAMETERS",
    "MAX_PARAMETER_DEPTH",
    "CODE_IN_THREAD_ELEMENTS",
    "PARSE_IN_THREAD_BYTES",
    "BytesElements",
    "check_count",
    "check_json_containers",
    "check_parameters",
]

#: Most dimensions a tensor may have (numpy's own limit: more is a ValueError there), and
#: most lists a tensor's JSON ``data`` may be nested in.
MAX_DIMS: Final = 64
#: inputs, and requested outputs, of one inference request (REST, gRPC, the engine link).
MAX_INPUTS: Final = 1024
#: JSON arrays and objects (``[`` and ``{``) in one request body.
MAX_JSON_CONTAINERS: Final = 1_000_000
#: fields (or parts) of one TorchServe form body.
MAX_FORM_FIELDS: Final = 1024
#: messages of one OpenAI chat completion request.
MAX_CHAT_MESSAGES: Final = 10_000
#: BYTES elements of one inference request, all its tensors together, on every path: JSON
#: ``data``, the binary extension, gRPC ``raw_input_contents`` and ``bytes_contents``. An
#: element is kept packed (:mod:`actorserve.packedbytes`), but a model that reads a
#: tensor's ``data`` makes a Python object of each (a ``bytes`` of 33 bytes and more, and
#: its pointer), while on the wire it may take two bytes: counted before any is made.
MAX_BYTES_ELEMENTS: Final = 1_000_000
#: JSON strings (values and keys) of one request body, counted as half its ``"`` bytes
#: before parsing: each is a Python ``str`` of 50 bytes and more once parsed.
MAX_JSON_STRINGS: Final = MAX_BYTES_ELEMENTS + 65_536
#: JSON object keys of one request body, counted as its ``:`` bytes before parsing: a
#: request has few (parameters are capped at MAX_PARAMETERS per object), and orjson
#: holds the GIL while it builds a dict, so 600,000 keys held every other request 0.7 s.
MAX_JSON_KEYS: Final = 65_536
#: JSON values of one request body (numbers, strings, ...), counted as its ``,`` bytes
#: before parsing: ``0,`` is two bytes on the wire and a pointer (8 bytes) in a list, then
#: 8 more in an array, once parsed.
MAX_JSON_VALUES: Final = 1 << 24
#: parameters of one request, and of each of its tensors and requested outputs (REST
#: ``parameters`` keys, gRPC ``parameters`` map entries).
MAX_PARAMETERS: Final = 1024
#: lists and objects nested in one parameter value (``[[1]]`` is two); deeper is refused,
#: as the encoders of every transport carry no deeper value.
MAX_PARAMETER_DEPTH: Final = 8
#: request bodies at least this large are parsed in a worker thread, off the event loop
#: (orjson takes about a millisecond per 500 KB).
PARSE_IN_THREAD_BYTES: Final = 512 * 1024
#: answers (and engine replies) holding at least this many tensor elements are encoded or
#: decoded in a worker thread: a BYTES element is a step of Python each.
CODE_IN_THREAD_ELEMENTS: Final = 65_536


def check_json_containers(body: bytes | bytearray | memoryview, what: str = "the request body") -> None:
    """:class:`BadInput` if ``body`` may hold more than :data:`MAX_JSON_CONTAINERS` JSON
    arrays and objects, :data:`MAX_JSON_KEYS` keys, :data:`MAX_JSON_STRINGS` strings or
    :data:`MAX_JSON_VALUES` values. Upper bounds (a ``[``, ``:``, ``"`` or ``,`` inside a
    string counts too), taken only for bodies long enough to exceed them, in C, before
    orjson builds anything."""
    if len(body) <= MAX_JSON_KEYS:
        return
    data = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    count = data.count(b"[") if len(data) > MAX_JSON_CONTAINERS else 0
    if count <= MAX_JSON_CONTAINERS and len(data) > MAX_JSON_CONTAINERS:
        count += data.count(b"{")
    if count > MAX_JSON_CONTAINERS:
        raise BadInput(
            f"{what} holds more than {MAX_JSON_CONTAINERS} JSON arrays and objects "
            "(limit MAX_JSON_CONTAINERS; see docs/security.md#limits)"
        )
    if len(data) > MAX_JSON_KEYS and data.count(b":") > MAX_JSON_KEYS:
        raise BadInput(
            f"{what} may hold more than {MAX_JSON_KEYS} JSON object keys (counted as its ':' "
            "characters; limit MAX_JSON_KEYS; see docs/security.md#limits)"
        )
    if len(data) > 2 * MAX_JSON_STRINGS and data.count(b'"') > 2 * MAX_JSON_STRINGS:
        raise BadInput(
            f"{what} may hold more than {MAX_JSON_STRINGS} JSON strings (counted as half its "
            "'\"' characters; limit MAX_JSON_STRINGS; see docs/security.md#limits)"
        )
    if len(data) > MAX_JSON_VALUES and data.count(b",") > MAX_JSON_VALUES:
        raise BadInput(
            f"{what} may hold more than {MAX_JSON_VALUES} JSON values (counted as its ',' "
            "characters; limit MAX_JSON_VALUES; see docs/security.md#limits)"
        )


class BytesElements:
    """The running count of one request's BYTES elements against
    :data:`MAX_BYTES_ELEMENTS`: :meth:`add` each tensor's element count (from its shape,
    or counted on the wire) before any element is decoded."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def add(self, count: int, name: str) -> None:
        self.count += count
        if self.count > MAX_BYTES_ELEMENTS:
            raise BadInput(
                f"input {name!r}: the request holds more than {MAX_BYTES_ELEMENTS} BYTES elements "
                "(limit MAX_BYTES_ELEMENTS; see docs/security.md#limits)"
            )


def check_parameters(parameters: Mapping[str, object], where: str) -> None:
    """:class:`BadInput` if ``parameters`` (a request's, a tensor's or a requested
    output's, as parsed from JSON) has more than :data:`MAX_PARAMETERS` keys or a value
    nested more than :data:`MAX_PARAMETER_DEPTH` lists and objects deep. Iterative: a
    deep value is refused, never a RecursionError."""
    if len(parameters) > MAX_PARAMETERS:
        raise BadInput(
            f"{where}: {len(parameters)} parameters given, at most {MAX_PARAMETERS} allowed "
            "(limit MAX_PARAMETERS; see docs/security.md#limits)"
        )
    # (container, its depth); scalars are never pushed
    stack: list[tuple[object, int]] = [(v, 1) for v in parameters.values() if isinstance(v, (list, dict))]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_PARAMETER_DEPTH:
            raise BadInput(
                f"{where}: a parameter value is nested more than {MAX_PARAMETER_DEPTH} lists and objects "
                "deep (limit MAX_PARAMETER_DEPTH; see docs/security.md#limits)"
            )
        items = value.values() if isinstance(value, dict) else value
        assert isinstance(items, Iterable)
        stack.extend((v, depth + 1) for v in items if isinstance(v, (list, dict)))


def check_count(items: Sized, limit: int, what: str, name: str) -> None:
    """:class:`BadInput` naming the limit ``name`` if ``items`` has more than ``limit``."""
    if len(items) > limit:
        raise BadInput(
            f"{what}: {len(items)} given, at most {limit} allowed (limit {name}; see docs/security.md#limits)"
        )
