"""The unary engine calls as typed records (actorserve.unary): one record and one table
row per @unary EngineAPI method, written from its signature by actorserve.unarygen, run
in process by Engine.call, and sent across the engine link as a name and the record's
fields, checked field by field on arrival."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import pytest
from support.models import recording_settings

import actorserve
from actorserve import unarygen
from actorserve.api import EngineAPI, ModelInfo, ModelState, UnaryCall, unary, unary_of
from actorserve.engine import Engine
from actorserve.errors import BadInput, ModelNotFound
from actorserve.ipc.unary_values import call_from_plain, call_to_plain, result_codec
from actorserve.unary import BY_NAME, UNARY_CALLS, dispatch, result_type
from actorserve.unary_records import (
    ROWS,
    Describe,
    GetInferenceStatistics,
    GetMetadata,
    GetModelInfo,
    GetRepositoryIndex,
    GetStatistics,
    IsReady,
    ListModels,
    LoadArchive,
    LoadFromRepository,
    SetDefaultVersion,
    SetWorkers,
    Unload,
    WaitIdle,
)

#: one record of each kind, every field given a value unlike its default
SAMPLES: list[UnaryCall[Any]] = [
    IsReady(),
    ListModels(),
    GetModelInfo("m", "1"),
    GetMetadata("m"),
    GetRepositoryIndex(),
    GetStatistics("m", "2"),
    LoadFromRepository("m", {"max_batch_size": 4, "parameters": {"a": [1, "b"]}}),
    LoadArchive("m.mar", name="n", handler="h", batch_size=2, max_batch_delay_ms=5, workers=3),
    Unload("m", "1", grace=0.5),
    SetWorkers("m", 2, None, 0),
    SetDefaultVersion("m", "2"),
    Describe("m"),
    GetInferenceStatistics(),
    WaitIdle(),
]

#: the EngineAPI methods that are not unary calls (they stream or take tensors)
NOT_UNARY = {"infer", "infer_stream", "stream", "call"}


def api_methods() -> dict[str, Any]:
    return {
        name: method
        for name, method in inspect.getmembers(EngineAPI, inspect.isfunction)
        if not name.startswith("_")
    }


def test_every_engine_api_method_is_a_unary_call_or_a_stream() -> None:
    """A method is labelled @unary (and has its record and row) or is one of the four
    that are not unary calls; a new method that is neither fails here. Every row has
    its Engine method, which takes the record's fields by keyword (dispatch's call)."""
    methods = api_methods()
    unary_names = {name for name, method in methods.items() if unary_of(method) is not None}
    assert unary_names | NOT_UNARY == set(methods)
    assert not unary_names & NOT_UNARY
    assert unary_names == set(BY_NAME) == {name for name, _, _ in ROWS}
    for name, row in BY_NAME.items():
        label = unary_of(methods[name])
        assert label is not None and (label.record, label.remembered) == (row.record.__name__, row.remembered)
        engine_method = getattr(Engine, name)
        assert inspect.iscoroutinefunction(engine_method)
        inspect.signature(engine_method).bind(None, **{f.name: f.default for f in attrs.fields(row.record)})
    assert {type(s) for s in SAMPLES} == set(UNARY_CALLS)
    assert {name for name, row in BY_NAME.items() if row.remembered} == {"model_info", "metadata"}


def test_the_written_files_are_up_to_date() -> None:
    """unary_records.py and ipc/unary_methods.py are what `python -m actorserve.unarygen`
    writes from api.py now (run it after changing a @unary method)."""
    for path, text in unarygen.rendered().items():
        assert path.read_text() == text, f"{path.name} is out of date: run python -m actorserve.unarygen"
    assert unarygen.main(["--check"]) == 0


class Paused(EngineAPI, Protocol):
    """EngineAPI with one more unary method, as a newcomer would add it."""

    @unary("Pause")
    async def pause(self, name: str, *, grace: float | None = None) -> None:
        """Stop taking requests for ``name``."""
        ...

    @unary("Peek", remembered=True)
    async def peek(self, name: str, limits: Mapping[str, Any] | None = None) -> list[ModelInfo]: ...


def test_a_new_unary_method_is_its_signature_and_nothing_else() -> None:
    """The recipe of docs/architecture.md ("A new engine-link message"): the method on
    the protocol, labelled @unary, is all the generator needs to write its record, its
    row and the engine client's method (the Engine's method is the other edit)."""
    methods = unarygen.unary_methods(Paused)
    assert [m.name for m in methods] == [*BY_NAME, "pause", "peek"]
    records = unarygen.render_records(methods)
    client = unarygen.render_methods(methods)
    for text in (records, client):
        compile(text, "<written>", "exec")
    assert "@attrs.frozen\nclass Pause(UnaryCall[None]):" in records
    assert "    name: str\n    grace: float | None = None\n" in records
    assert "class Peek(UnaryCall[list[ModelInfo]]):" in records
    assert "('pause', Pause, False)," in records and "('peek', Peek, True)," in records
    assert "from collections.abc import Mapping" in records
    assert (
        "    async def pause(self, name: str, *, grace: float | None = None) -> None:\n"
        "        await self.call(Pause(name, grace))\n"
    ) in client
    assert (
        "        remembered: list[ModelInfo] | None = self._remembered.get((Peek, name, limits))\n"
        "        return remembered if remembered is not None else await self.call(Peek(name, limits))\n"
    ) in client


class Splat(EngineAPI, Protocol):
    @unary("Splat")
    async def splat(self, *names: str) -> None: ...


class Bare(EngineAPI, Protocol):
    @unary("Bare")
    async def bare(self, name) -> None: ...  # type: ignore[no-untyped-def]


class Silent(EngineAPI, Protocol):
    @unary("Silent", remembered=True)
    async def silent(self, name: str) -> None: ...


class Foreign(EngineAPI, Protocol):
    @unary("Foreign")
    async def foreign(self, name: str) -> Path: ...


def test_a_method_is_labelled_once() -> None:
    """A label put on a method by mistake (its own lost) is refused where it is written."""
    with pytest.raises(TypeError, match="pause is labelled @unary twice"):

        class Twice(EngineAPI, Protocol):
            @unary("Pause")
            @unary("Resume")
            async def pause(self, name: str) -> None: ...


@pytest.mark.parametrize(
    ("protocol", "message"),
    [
        (Splat, r"splat: a unary call's parameter is plain and annotated: \*names"),
        (Bare, "bare: a unary call's parameter is plain and annotated: name"),
        (Silent, "silent: a remembered call answers something"),
        (Foreign, "Path: a unary call's annotations name what actorserve.api imports"),
    ],
    ids=lambda p: getattr(p, "__name__", None),
)
def test_a_signature_the_records_cannot_carry_is_refused(protocol: type[Any], message: str) -> None:
    """The generator says which method and why, rather than writing code that breaks."""
    with pytest.raises(TypeError, match=message):
        unarygen.rendered(protocol)


@pytest.mark.parametrize("record", sorted(UNARY_CALLS, key=lambda r: r.__name__), ids=lambda r: r.__name__)
def test_a_record_is_its_methods_parameters(record: type[UnaryCall[Any]]) -> None:
    """Same names, same order, same defaults, and the record names the method's return
    type; so a record read back from the link calls the method as its caller meant."""
    method = getattr(EngineAPI, UNARY_CALLS[record].name)
    parameters = list(inspect.signature(method).parameters.values())[1:]  # self
    fields = attrs.fields(record)
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        default = attrs.NOTHING if parameter.default is inspect.Parameter.empty else parameter.default
        assert field.default == default
        assert str(field.type) == parameter.annotation
    assert result_type(record) == typing.get_type_hints(method)["return"]


@pytest.mark.parametrize("request_", SAMPLES, ids=lambda s: type(s).__name__)
def test_a_record_crosses_the_link_as_its_name_and_fields(request_: UnaryCall[Any]) -> None:
    name, args = call_to_plain(request_)
    assert name == UNARY_CALLS[type(request_)].name
    assert call_from_plain(name, args) == request_
    result_codec(type(request_))  # every result type has a codec


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("nope", {}, "the engine has no method 'nope'"),
        ("unload", {"name": "m", "force": True}, "unload: unexpected arguments ['force']"),
        ("unload", {"version": "1"}, "unload: name is required"),
        ("unload", {"name": None}, "unload: name must be a string, got None"),
        ("unload", {"name": "m", "grace": "1"}, "unload: grace must be a number or nil, got '1'"),
        ("unload", {"name": "m", "grace": True}, "unload: grace must be a number or nil, got True"),
        ("set_workers", {"name": "m", "workers": 1.5}, "set_workers: workers must be an integer, got 1.5"),
        ("set_default_version", {"name": "m", "version": None}, "version must be a string, got None"),
        ("load_from_repository", {"name": "m", "config": [1]}, "config must be a map or nil, got [1]"),
        ("load_from_repository", {"name": "m", "config": {1: 2}}, "config must be a map or nil"),
        ("load_archive", {"path": "x", "workers": "2"}, "load_archive: workers must be an integer or nil"),
        ("inference_statistics", {"name": None}, "inference_statistics: name must be a string"),
    ],
)
def test_a_malformed_call_is_bad_input(name: str, args: dict[str, Any], message: str) -> None:
    """What the engine side answers a front that sent nonsense: that call fails (400),
    the link stays."""
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        call_from_plain(name, args)


def test_a_grace_may_cross_as_an_integer() -> None:
    assert call_from_plain("unload", {"name": "m", "grace": 0}) == Unload("m", grace=0)


async def test_engine_call_runs_each_record_as_its_named_method() -> None:
    models = [recording_settings("rec"), recording_settings("other")]
    async with actorserve.open_engine(models) as engine:
        assert await engine.call(IsReady()) is await engine.ready() is True
        assert await engine.call(ListModels()) == await engine.models()
        assert await engine.call(GetModelInfo("rec")) == await engine.model_info("rec")
        assert await engine.call(GetMetadata("rec", "1")) == await engine.metadata("rec", "1")
        assert await engine.call(GetRepositoryIndex()) == await engine.repository_index()
        assert await engine.call(GetStatistics("rec")) == await engine.statistics("rec")
        assert await engine.call(Describe("rec")) == await engine.describe("rec")
        assert await engine.call(GetInferenceStatistics("rec")) == await engine.inference_statistics("rec")
        await engine.call(SetWorkers("rec", 2, grace=0))
        assert (await engine.model_info("rec")).workers == 2
        await engine.call(SetDefaultVersion("rec", "1"))
        await engine.call(WaitIdle())
        await engine.call(Unload("other", grace=0))
        assert [m.name for m in await engine.models()] == ["rec"]
        with pytest.raises(ModelNotFound, match="'other' is not loaded"):
            await dispatch(engine, GetModelInfo("other"))
        assert (await engine.call(GetModelInfo("rec"))).state is ModelState.READY


async def test_a_record_outside_the_table_is_refused() -> None:
    @attrs.frozen
    class Shutdown(UnaryCall[None]):
        pass

    async with actorserve.open_engine([recording_settings("rec")]) as engine:
        with pytest.raises(TypeError, match="Shutdown is not a unary engine call"):
            await engine.call(Shutdown())
