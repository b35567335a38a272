"""Per-request count limits, checked before anything is parsed or allocated for them.

A request's bytes are bounded by ``max_body_bytes``, but a few bytes can still stand for
many Python objects: ``[],`` is one list in three bytes (60 KiB of gzip inflated to 21 M
lists and 2.3 GB), ``{}`` one input, ``a=&`` one form field. Each limit here is far above
what a legitimate request sends and is refused with a :class:`BadInput` naming it. They
are fixed, like numpy's 64 dimensions or orjson's 1,024 nesting levels: the amount of
real data stays bounded by ``max_body_bytes``. The shape limits (``MAX_DIMS``,
``MAX_EXTENT``) live with the shape check in :mod:`actorserve.codecs`.

No I/O; every check is a count done in C (``bytes.count``) or on an already-built list.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Final

from .errors import BadInput

__all__ = [
    "MAX_BYTES_ELEMENTS",
    "MAX_CHAT_MESSAGES",
    "MAX_FORM_FIELDS",
    "MAX_INPUTS",
    "MAX_JSON_CONTAINERS",
    "PARSE_IN_THREAD_BYTES",
    "check_count",
    "check_json_containers",
]

#: inputs, and requested outputs, of one inference request (REST, gRPC, the engine link).
MAX_INPUTS: Final = 1024
#: JSON arrays and objects (``[`` and ``{``) in one request body.
MAX_JSON_CONTAINERS: Final = 1_000_000
#: fields (or parts) of one TorchServe form body.
MAX_FORM_FIELDS: Final = 1024
#: messages of one OpenAI chat completion request.
MAX_CHAT_MESSAGES: Final = 10_000
#: ``bytes_contents`` elements of one gRPC ``ModelInferRequest`` (an empty one is two bytes
#: on the wire, a Python object once parsed); ``raw_input_contents`` has no such limit.
MAX_BYTES_ELEMENTS: Final = 1_000_000
#: request bodies at least this large are parsed in a worker thread, off the event loop
#: (orjson takes about a millisecond per 500 KB).
PARSE_IN_THREAD_BYTES: Final = 512 * 1024


def check_json_containers(body: bytes | bytearray | memoryview, what: str = "the request body") -> None:
    """:class:`BadInput` if ``body`` may hold more than :data:`MAX_JSON_CONTAINERS` JSON
    arrays and objects. An upper bound (a ``[`` inside a string counts too), taken
    only for bodies long enough to exceed it, in C, before orjson builds anything."""
    if len(body) <= MAX_JSON_CONTAINERS:
        return
    data = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    count = data.count(b"[")
    if count <= MAX_JSON_CONTAINERS:
        count += data.count(b"{")
    if count > MAX_JSON_CONTAINERS:
        raise BadInput(
            f"{what} holds more than {MAX_JSON_CONTAINERS} JSON arrays and objects "
            "(limit MAX_JSON_CONTAINERS; see docs/security.md#limits)"
        )


def check_count(items: Sized, limit: int, what: str, name: str) -> None:
    """:class:`BadInput` naming the limit ``name`` if ``items`` has more than ``limit``."""
    if len(items) > limit:
        raise BadInput(
            f"{what}: {len(items)} given, at most {limit} allowed (limit {name}; see docs/security.md#limits)"
        )
