"""A request's controls: what the server, not the model, acts on (``sequence_id`` /
``_start`` / ``_end`` / ``_cancel``, the ``sequence_owner`` the transports add, Triton's
``priority`` and ``timeout``), as one :class:`RequestControl` record on
:attr:`InferenceRequest.control <actorserve.types.InferenceRequest.control>`, and the one
boolean parser every door uses for flags. Pure code; re-exported by :mod:`actorserve.api`.

Each door's wire module fills the record once (:meth:`RequestControl.from_parameters`,
after its headers joined the parameters); it crosses the engine link as one field and
the engine's host, runners and scheduler read that field, never the parameters. A
request that reaches the engine without one (an embedded caller's
``InferenceRequest(parameters={"sequence_id": ...})``) gets it from its parameters
there, once (:func:`control_of`). The parameters stay as they came: models see them as
before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol, TypeVar

import attrs

from .errors import BadInput

#: Longest client-chosen sequence id by default (``sequence.max_id_length``): ids are
#: kept per open and per recently ended sequence and echoed in a response header.
MAX_SEQUENCE_ID_LENGTH: Final = 128


def bool_parameter(value: object, name: str) -> bool:
    """A boolean from JSON, gRPC or a header (true/false, 1/0, yes/no, "" is false);
    :class:`BadInput` names the parameter otherwise. The one bool parser."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
    raise BadInput(f"parameter {name!r}: expected a boolean, got {value!r}")


#: An id length bound that bounds nothing: for a transport that reads the controls only to
#: order a sequence's requests (the engine judges the id by its model's ``max_id_length``).
ANY_ID_LENGTH: Final = 1 << 62
#: Characters a sequence id may hold: printable ASCII, so that its echo in the
#: ``sequence-id`` header (and the access log) can never add a line or a header.
SEQUENCE_ID_CHARACTERS: Final = frozenset(chr(c) for c in range(0x20, 0x7F))
#: The request parameter that carries who opened a sequence (set by the transports).
OWNER_PARAMETER: Final = "sequence_owner"


def no_sequence_id(value: object) -> bool:
    """Whether a ``sequence_id`` parameter names no sequence: absent, 0 or "" (as in
    Triton). Every door and the engine ask here; a header's or gRPC metadata's text
    also says it with "0" (:func:`no_sequence_text`)."""
    return value is None or value == 0 or value == ""


def no_sequence_text(text: str) -> bool:
    """Whether the text of a ``sequence-id`` header or gRPC metadata names no sequence:
    "" or "0" (text has no number 0; the caller strips where its wire allows spaces)."""
    return text in ("", "0")


@attrs.frozen(slots=True)
class RequestControl:
    """What the server acts on in one request. ``sequence_id`` (None: no sequence) and
    start/end/cancel; ``owner``: the fingerprint of the token the request came with when
    sequences are bound to tokens (None: not bound); ``priority`` and ``timeout``:
    Triton's, when a client sent them as non-negative integers (``priority`` orders a
    BatchModel's admissions, :mod:`actorserve.actors.scheduler`; ``timeout`` is carried,
    not acted on yet: a server that does not act on it takes it and ignores it);
    ``trace``: the W3C ``traceparent`` of the span the engine's spans of this request are
    children of, when tracing is on (:mod:`actorserve.tracing`; set by the doors' engine,
    never read from a client)."""

    sequence_id: str | None = None
    start: bool = False
    end: bool = False
    cancel: bool = False
    owner: str | None = None
    priority: int | None = None
    timeout: int | None = None
    trace: str | None = None

    @property
    def stateful(self) -> bool:
        return self.sequence_id is not None or self.start or self.cancel

    def checked(self, max_id_length: int) -> RequestControl:
        """``self``; :class:`BadInput` for a sequence id over ``max_id_length`` characters
        (the model's ``sequence.max_id_length``: the doors read ids with no cap)."""
        if self.sequence_id is not None and len(self.sequence_id) > max_id_length:
            _checked_id(self.sequence_id, max_id_length)
        return self

    @classmethod
    def from_parameters(
        cls, params: Mapping[str, Any] | None, max_id_length: int = MAX_SEQUENCE_ID_LENGTH
    ) -> RequestControl:
        """Read ``sequence_id/start/end/cancel``, ``priority`` and ``timeout`` (the
        transports put headers there too); never ``sequence_owner`` (only the doors'
        :class:`~actorserve.transport.owner.OwnerStamp` and :func:`control_of` set the
        owner). An id of 0 or "" means no sequence, as in Triton; :class:`BadInput`
        otherwise, and for an id over ``max_id_length`` characters or with a character
        that is not printable ASCII."""
        if not params:
            return NO_CONTROL
        raw_id = params.get("sequence_id")
        sequence_id: str | None
        if no_sequence_id(raw_id):
            sequence_id = None
        elif isinstance(raw_id, bool) or not isinstance(raw_id, (int, str)):
            raise BadInput(f"parameter 'sequence_id': expected an integer or a string, got {_short(raw_id)}")
        else:
            sequence_id = _checked_id(str(raw_id), max_id_length)
        start = params.get("sequence_start", False)
        end = params.get("sequence_end", False)
        cancel = params.get("sequence_cancel", False)
        priority = _count(params.get("priority"))
        timeout = _count(params.get("timeout"))
        if sequence_id is None and start is False and end is False and cancel is False:
            if priority is None and timeout is None:
                return NO_CONTROL
            return cls(priority=priority, timeout=timeout)
        return cls(
            sequence_id=sequence_id,
            start=bool_parameter(start, "sequence_start"),
            end=bool_parameter(end, "sequence_end"),
            cancel=bool_parameter(cancel, "sequence_cancel"),
            priority=priority,
            timeout=timeout,
        )


class Controlled(Protocol):
    """What :func:`control_of` reads: an :class:`~actorserve.types.InferenceRequest`."""

    control: RequestControl | None
    parameters: dict[str, Any]


def control_of(request: Controlled) -> RequestControl:
    """``request.control``; for a request that came without one (an embedded caller's
    ``engine.infer(InferenceRequest(..., parameters={"sequence_id": ...}))``), read from
    its parameters once and kept on it, with ``sequence_owner`` taken out of them (the
    model never sees who its caller is). Ids are read with no cap here: the host checks
    the model's (:meth:`RequestControl.checked`)."""
    control = request.control
    if control is None:
        params = request.parameters
        owner = params.pop(OWNER_PARAMETER, None) if params else None
        control = RequestControl.from_parameters(params, ANY_ID_LENGTH)
        if owner is not None:
            control = attrs.evolve(control, owner=str(owner))
        request.control = control
    return control


R = TypeVar("R", bound=Controlled)


def with_control(request: R) -> R:
    """``request``, its control record read from its parameters: what each door's wire
    module calls once it has put its headers there. Ids are read with no cap (the host
    checks the model's); ``sequence_owner`` is never read here (:class:`OwnerStamp
    <actorserve.transport.owner.OwnerStamp>` sets the owner). :class:`BadInput` as
    :meth:`RequestControl.from_parameters`."""
    request.control = RequestControl.from_parameters(request.parameters, ANY_ID_LENGTH)
    return request


def _count(value: object) -> int | None:
    """A non-negative integer (Triton's uint64 ``priority`` / ``timeout``), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _checked_id(sequence_id: str, max_length: int) -> str:
    if len(sequence_id) > max_length:
        raise BadInput(
            f"parameter 'sequence_id': {len(sequence_id)} characters, over the limit of {max_length} "
            "(sequence.max_id_length)"
        )
    if not SEQUENCE_ID_CHARACTERS.issuperset(sequence_id):
        raise BadInput(
            "parameter 'sequence_id': only printable ASCII characters (no control characters) are allowed, "
            f"got {_short(sequence_id)}"
        )
    return sequence_id


def _short(value: object) -> str:
    """``repr(value)``, cut to 40 characters: an error never echoes a huge value."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: The controls of a request that sets none (shared: the record is frozen).
NO_CONTROL: Final = RequestControl()


__all__ = [
    "ANY_ID_LENGTH",
    "MAX_SEQUENCE_ID_LENGTH",
    "NO_CONTROL",
    "OWNER_PARAMETER",
    "SEQUENCE_ID_CHARACTERS",
    "Controlled",
    "RequestControl",
    "bool_parameter",
    "control_of",
    "no_sequence_id",
    "no_sequence_text",
    "with_control",
]
