"""The engine's unary methods as typed records, and the one table that runs them.

Each unary (management) method of :class:`~actorserve.api.EngineAPI` is written once,
in ``api.py``, labelled ``@unary("Record")``. From that signature
``python -m actorserve.unarygen`` writes (:mod:`actorserve.unarygen`):

- its record (:mod:`actorserve.unary_records`), a frozen
  :class:`~actorserve.api.UnaryCall` whose fields are the method's parameters by the
  same names and whose base names its result type (:class:`Unload` is a
  ``UnaryCall[None]``), and its row;
- the engine client's named method (:mod:`actorserve.ipc.unary_methods`), one
  ``call`` of the record, which ``EngineClient`` inherits.

Everything else follows from :data:`UNARY_CALLS`, this module's table of those rows:

- ``Engine.call`` runs a record in process (:func:`dispatch`: the engine's method of
  the row's name, called with the record's fields);
- the engine link (:mod:`actorserve.ipc.unary_values`) sends a record as its name and
  fields, and its result by the codec of the record's result type; the engine side
  decodes it and calls ``engine.call``.

So adding a unary method is two edits: the method on ``EngineAPI`` (``api.py``) and on
:class:`~actorserve.engine.Engine` (``engine/core.py``), then running the generator
(docs/architecture.md, "Which files a newcomer edits"). mypy checks the Engine against
the protocol and the written code like any other; ``tests/test_unary.py`` fails while
the written files are out of date. The link checks each value it receives against its
field's annotation (:func:`~actorserve.ipc.unary_values.call_from_plain`), so a
parameter is ``str``, ``int``, ``float``, ``bool`` or ``Mapping[str, Any]``, optionally
``| None``.

Why a generator, weighed against the other ways to write a signature once: classes made
at import (the records, or the client's methods from the table) are invisible to mypy,
which then cannot check that ``EngineClient`` is an ``EngineAPI``; a hand-written
client method or record per method is the copy this removes; a protocol default that
builds the record needs the record written out anyway. Written files are plain code a
newcomer reads, and mypy checks them (the project regenerates its gRPC code and
docs/cli.md the same way).
"""

from __future__ import annotations

import typing
from typing import Any, Final, Generic, TypeVar

import attrs

from .api import EngineAPI, UnaryCall
from .unary_records import ROWS

T = TypeVar("T")
R = TypeVar("R", bound=UnaryCall[Any])


@attrs.frozen
class Route(Generic[R]):
    """A row of :data:`UNARY_CALLS`: how one record is named on the link and run."""

    #: its name on the engine link, the EngineAPI method it runs
    name: str
    record: type[R]
    #: a front may keep the answer until the engine pushes ``ModelsChanged``
    #: (``@unary(..., remembered=True)``, :class:`~actorserve.api.Unary`)
    remembered: bool = False

    @property
    def result(self) -> Any:
        """The type its answer has (the ``T`` of the record's ``UnaryCall[T]``)."""
        return result_type(self.record)


#: record type -> its row. The engine side serves exactly these unary calls; ``infer``
#: and the streams have messages of their own (:mod:`actorserve.ipc.frames`).
UNARY_CALLS: Final[dict[type[UnaryCall[Any]], Route[Any]]] = {
    record: Route(name, record, remembered) for name, record, remembered in ROWS
}

#: link name -> row (what the engine side decodes a call by)
BY_NAME: Final[dict[str, Route[Any]]] = {row.name: row for row in UNARY_CALLS.values()}


def result_type(record: type[UnaryCall[Any]]) -> Any:
    """The ``T`` of ``record``'s ``UnaryCall[T]`` base, as written there (``list[ModelInfo]``;
    ``type(None)`` for ``None``)."""
    for base in getattr(record, "__orig_bases__", ()):
        if typing.get_origin(base) is UnaryCall:
            return typing.get_args(base)[0]
    raise TypeError(f"{record.__name__} does not name its result type (UnaryCall[...])")


async def dispatch(engine: EngineAPI, request: UnaryCall[T]) -> T:
    """Run ``request`` against ``engine``'s named method, by the table: what
    ``Engine.call`` does. ``TypeError`` (a bug, not the client's mistake: the link
    decodes only the table's records) for a record the table does not know."""
    row = UNARY_CALLS.get(type(request))
    if row is None:
        raise TypeError(f"{type(request).__name__} is not a unary engine call")
    # by keyword: a record's fields are its method's parameters, by the same names
    fields = {field.name: getattr(request, field.name) for field in attrs.fields(row.record)}
    result: T = await getattr(engine, row.name)(**fields)
    return result


__all__ = [
    "BY_NAME",
    "UNARY_CALLS",
    "Route",
    "dispatch",
    "result_type",
]
