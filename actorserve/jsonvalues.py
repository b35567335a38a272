"""Type checks of values decoded from JSON (a client's request, a settings file): each
value is what it must be, or a :class:`ValueError` subclass the caller names; nothing
is converted (a list of pairs is not an object, ``"5"`` and ``true`` are not numbers),
so no later check can be passed by another spelling of the same data.

No I/O; the error type is the caller's (``error``), so each layer keeps its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def kind(value: object) -> str:
    """What JSON calls ``value``'s type, for a message ("an array", "a string", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def json_object(value: object, where: str, error: type[ValueError] = ValueError) -> Mapping[str, Any]:
    """``value`` if it is a JSON object with string keys (null: an empty one); else
    ``error`` naming ``where``: an array of pairs included."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise error(f"{where} must be a JSON object, not {kind(value)}")
    return value


def whole_number(value: object, where: str, error: type[ValueError] = ValueError) -> int:
    """``value`` if it is an integer (not a boolean); else ``error`` naming ``where``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{where} must be an integer, not {kind(value)}")
    return value


def json_number(value: object, where: str, error: type[ValueError] = ValueError) -> float:
    """``value`` as a float if it is a number (not a boolean); else ``error``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise error(f"{where} must be a number, not {kind(value)}")
    return float(value)


__all__ = ["json_number", "json_object", "kind", "whole_number"]
