"""The command line's own value types: what an option of ``python -m actorserve`` takes
where a plain click type does not say it (a port, or ``off``), and how ``--help`` shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    _PortBase = click.ParamType[int | None]
else:  # before click 8.4, ParamType is not generic
    _PortBase = click.ParamType


class Port(_PortBase):
    """A port number, or ``off`` (None: the transport is off). The range is checked by
    :class:`Settings`."""

    name = "port"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text in ("off", "none"):
            return None
        try:
            return int(text)
        except ValueError:
            self.fail(f"{value!r} is not a port number or 'off'", param, ctx)


def metavar_of(kind: click.ParamType[Any]) -> str | None:
    """What ``--help`` shows for an option's value (None: click's own)."""
    if isinstance(kind, Port):
        return "PORT|off"
    if isinstance(kind, click.Choice):
        return "[" + "|".join(str(choice) for choice in kind.choices) + "]"
    return None


__all__ = ["Port", "metavar_of"]
