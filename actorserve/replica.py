"""Replica identity: what one server process group is called when several run behind a
proxy (``--replica-id``, default the host name), the sequence ids it makes, and the
error for a sequence it does not hold (which blames a proxy only where there can be
one). No I/O.

A server-made sequence id is ``<replica>_<32 hex digits>``: the replica part (at most
:data:`MAX_PREFIX` characters of the replica id, letters, digits, ``.`` and ``-``)
tells an operator where a sequence was opened; the 128 random bits make it a bearer
secret as before. With SageMaker's header preset (``--sequence-headers sagemaker``,
whose session ids are letters and digits joined by ``-``) it is
``<replica>--<32 hex digits>``, ``.`` in the replica made ``-``. See
docs/deploy.md#stickiness.
"""

from __future__ import annotations

import re
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Final

import attrs

from .controls import control_of
from .errors import SequenceNotFound, SequenceNotHeld, ShuttingDown
from .types import InferenceRequest

#: the response header (and gRPC initial metadata key) naming the replica that answered
REPLICA_HEADER: Final = "actorserve-replica"
#: longest replica part of a server-made id
MAX_PREFIX: Final = 32
#: a replica id as accepted by ``--replica-id``: safe in a header, a metric label, an id
REPLICA_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}")

_NOT_IN_PREFIX: Final = re.compile(r"[^A-Za-z0-9.-]")
#: a server-made id (of any replica): its replica part, then the random part
_MADE: Final = re.compile(rf"([A-Za-z0-9.-]{{1,{MAX_PREFIX}}})(?:_|--)[0-9a-f]{{32}}")


def replica_id(setting: str | None) -> str:
    """The replica id to use: the setting, or (None) this machine's host name (a
    Kubernetes pod's name), made safe for a header and a label."""
    name = setting or socket.gethostname() or "replica"
    return _NOT_IN_PREFIX.sub("-", name)[:63].strip("-.") or "replica"


def new_sequence_id(replica: str = "", *, sagemaker: bool = False) -> str:
    """A server-made sequence id: ``<replica>_`` (when ``replica``; ``sagemaker``:
    ``<replica>--``, in SageMaker's session id alphabet) and 128 bits from
    :mod:`secrets` as 32 hex digits."""
    random_part = secrets.token_hex(16)
    prefix = _prefix(replica)
    if sagemaker:
        prefix = prefix.replace(".", "-")
        return f"{prefix}--{random_part}" if prefix else random_part
    return f"{prefix}_{random_part}" if prefix else random_part


def _prefix(replica: str) -> str:
    return _NOT_IN_PREFIX.sub("-", replica)[:MAX_PREFIX].strip("-.")


def made_by(sequence_id: str) -> str | None:
    """The replica part of a server-made id, or None for an id a client chose."""
    match = _MADE.fullmatch(sequence_id)
    return match[1] if match else None


def not_held(sequence_id: str, replica: str, *, proxied: bool = True) -> SequenceNotFound:
    """The error for a request (not a start) naming a sequence ``replica`` does not
    hold and never ended.

    Behind a proxy (``proxied``: the server was given ``--replica-id``, as every replica
    behind one is, see docs/deploy.md) or for an id another replica made, it is
    :class:`SequenceNotHeld`: it says which replica answered, which made the id when
    the id says so, and that the proxy routes on the ``sequence-id`` header. A lone
    server (no ``--replica-id``) that gets an id no other replica made blames no proxy:
    a plain :class:`SequenceNotFound`, "unknown sequence"."""
    origin = made_by(sequence_id)
    foreign = origin is not None and origin not in (_prefix(replica), _prefix(replica).replace(".", "-"))
    if not proxied and not foreign:
        return SequenceNotFound(
            f"unknown sequence {sequence_id!r}: it is not open on this server (it never started here, "
            "ended long ago, or the server restarted since); start it with sequence_start"
        )
    where = f"; the id was made by replica {origin!r}" if foreign else ""
    return SequenceNotHeld(
        sequence_id,
        f"sequence {sequence_id!r} is not open on replica {replica!r} (unknown id{where}; a proxy "
        "sent it to another replica than its start: every request of a sequence must carry its "
        "id in the header the proxy routes on ('sequence-id' by default; gRPC: metadata); or the "
        "replica that held it stopped; start it with sequence_start)",
    )


def mint_id(request: InferenceRequest, replica: str, *, draining: bool = False) -> None:
    """Give a start without a sequence id a server-made one naming ``replica`` (in its
    control record and in its parameters, so the model sees it as before and the
    responses echo it). Anything else is left as it is. ``draining`` (scale-in,
    docs/deploy.md#drain): a start is refused with :class:`ShuttingDown` (503 /
    UNAVAILABLE, so a client or proxy retries elsewhere)."""
    # the model's own id cap (sequence.max_id_length) is checked after this, by its host
    control = control_of(request)
    if not control.start:
        return
    if draining:
        raise ShuttingDown(f"replica {replica!r} is draining: start the sequence on another replica")
    if control.sequence_id is None:
        sequence_id = new_sequence_id(replica)
        request.parameters["sequence_id"] = sequence_id
        request.control = attrs.evolve(control, sequence_id=sequence_id)


async def minting(requests: AsyncIterator[InferenceRequest], replica: str) -> AsyncIterator[InferenceRequest]:
    """``requests``, each start without an id given one (:func:`mint_id`)."""
    async for request in requests:
        mint_id(request, replica)
        yield request


@contextmanager
def naming(replica: str, *, proxied: bool = True) -> Iterator[None]:
    """Re-raise a :class:`SequenceNotHeld` from the block as :func:`not_held` of
    ``replica`` (the supervisor below does not know what its server is called, nor
    whether it runs behind a proxy: ``proxied``)."""
    try:
        yield
    except SequenceNotHeld as exc:
        if exc.sequence_id is None:
            raise
        raise not_held(exc.sequence_id, replica, proxied=proxied) from None


__all__ = [
    "MAX_PREFIX",
    "REPLICA_HEADER",
    "REPLICA_ID",
    "made_by",
    "minting",
    "mint_id",
    "naming",
    "new_sequence_id",
    "not_held",
    "replica_id",
]
