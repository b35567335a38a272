"""The sequence part of a request (``sequence_id`` / ``_start`` / ``_end`` / ``_cancel``,
and the ``sequence_owner`` the transports add), read once per request, and the one
boolean parser every door uses for flags. Pure code; re-exported by :mod:`actorserve.api`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .errors import BadInput
from .types import MAX_SEQUENCE_ID_LENGTH


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


@attrs.frozen(slots=True)
class SequenceControl:
    """The sequence part of a request: ``id`` (None: no sequence) and start/end/cancel;
    ``owner``: the fingerprint of the token the request came with when sequences are
    bound to tokens (None: not bound)."""

    id: str | None = None
    start: bool = False
    end: bool = False
    cancel: bool = False
    owner: str | None = None

    @property
    def stateful(self) -> bool:
        return self.id is not None or self.start or self.cancel

    @classmethod
    def take(cls, params: dict[str, Any], max_id_length: int = MAX_SEQUENCE_ID_LENGTH) -> SequenceControl:
        """:meth:`from_parameters`, and ``sequence_owner`` taken out of ``params`` (the
        engine's look at a request: the model never sees who its caller is)."""
        owner = params.pop(OWNER_PARAMETER, None) if params else None
        control = cls.from_parameters(params, max_id_length)
        if owner is None:
            return control
        return attrs.evolve(control, owner=str(owner))

    @classmethod
    def from_parameters(
        cls, params: Mapping[str, Any] | None, max_id_length: int = MAX_SEQUENCE_ID_LENGTH
    ) -> SequenceControl:
        """Read ``sequence_id/start/end/cancel`` (the transports put headers there too).
        An id of 0 or "" means no sequence, as in Triton; :class:`BadInput` otherwise,
        and for an id over ``max_id_length`` characters or with a character that is not
        printable ASCII."""
        if not params:
            return _NO_SEQUENCE
        raw_id = params.get("sequence_id")
        sequence_id: str | None
        if raw_id is None or raw_id == 0 or raw_id == "":
            sequence_id = None
        elif isinstance(raw_id, bool) or not isinstance(raw_id, (int, str)):
            raise BadInput(f"parameter 'sequence_id': expected an integer or a string, got {_short(raw_id)}")
        else:
            sequence_id = _checked_id(str(raw_id), max_id_length)
        start = params.get("sequence_start", False)
        end = params.get("sequence_end", False)
        cancel = params.get("sequence_cancel", False)
        if sequence_id is None and start is False and end is False and cancel is False:
            return _NO_SEQUENCE
        return cls(
            id=sequence_id,
            start=bool_parameter(start, "sequence_start"),
            end=bool_parameter(end, "sequence_end"),
            cancel=bool_parameter(cancel, "sequence_cancel"),
        )


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


_NO_SEQUENCE = SequenceControl()


__all__ = ["ANY_ID_LENGTH", "OWNER_PARAMETER", "SEQUENCE_ID_CHARACTERS", "SequenceControl", "bool_parameter"]
