"""Sequence ids as bearer secrets, in the engine (issue 19, findings 4 and 7), driven by
trio's MockClock: server-made ids are 128 random bits, client ids have a length and
character cap, a sequence bound to its opener's token is invisible to other tokens, a
token holds at most ``max_sequences_per_token``, eviction never takes another token's
sequence, and a refusal's ``retry_after`` says when a slot can free. The doors (REST,
gRPC, TorchServe, OpenAI) are in test_sec_sequences_e2e.py."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import trio
import trio.testing
from support.models import RecordingModel, recording_settings, request
from support.replicas import not_held_message

import actorserve
from actorserve import BadInput, Overloaded, SequenceNotFound, SequenceSettings
from actorserve.api import OWNER_PARAMETER, RequestControl
from actorserve.replica import MAX_PREFIX, made_by, replica_id
from actorserve.settings import BadSetting, Settings


def seq(
    request_id: str, sid: Any = None, *, owner: str | None = None, **flags: Any
) -> actorserve.InferenceRequest:
    params: dict[str, Any] = {f"sequence_{k}": v for k, v in flags.items()}
    if sid is not None:
        params["sequence_id"] = sid
    if owner is not None:
        params[OWNER_PARAMETER] = owner
    return request(request_id, 1, **params)


def unknown(sid: str) -> str:
    """What a request for an id that was never opened is told (by a replica named after this host)."""
    return not_held_message(sid)


# -- server-made ids ---------------------------------------------------------------------


async def test_server_made_ids_are_128_random_bits(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(sequence=SequenceSettings(max_sequences=2000, idle_timeout_ms=0))
    async with actorserve.open_engine([settings]) as engine:
        ids = []
        for k in range(1000):
            response = await engine.infer(seq(f"r{k}", start=True))
            ids.append(response.parameters["sequence_id"])
    # <replica>_<128 random bits>: the prefix says where it was made, the rest is the secret
    prefix = replica_id(None)[:MAX_PREFIX].strip("-.") + "_"
    assert all(re.fullmatch(re.escape(prefix) + r"[0-9a-f]{32}", sid) for sid in ids), ids[:3]
    assert all(made_by(sid) == prefix[:-1] for sid in ids)
    ids = [sid.removeprefix(prefix) for sid in ids]
    assert len(set(ids)) == 1000
    # no shared prefix and no counter: neighbours differ, as random numbers do
    assert len({sid[:8] for sid in ids}) > 990
    numbers = [int(sid, 16) for sid in ids]
    assert not any(abs(b - a) < 1 << 64 for a, b in itertools.pairwise(numbers))
    # every hex digit turns up about equally often (32,000 digits; 2,000 each expected)
    counts = [sum(sid.count(d) for sid in ids) for d in "0123456789abcdef"]
    assert min(counts) > 1700 and max(counts) < 2300, counts


# -- the id cap ----------------------------------------------------------------------------


def test_an_id_over_the_cap_or_with_a_control_character_is_refused() -> None:
    assert RequestControl.from_parameters({"sequence_id": "x" * 128}).sequence_id == "x" * 128
    assert RequestControl.from_parameters({"sequence_id": 10**127}).sequence_id == str(10**127)
    with pytest.raises(BadInput, match=r"129 characters, over the limit of 128 \(sequence.max_id_length\)"):
        RequestControl.from_parameters({"sequence_id": "x" * 129})
    with pytest.raises(BadInput, match=r"over the limit of 128"):
        RequestControl.from_parameters({"sequence_id": 10**128})
    huge = "y" * (1 << 20)
    with pytest.raises(BadInput) as refused:
        RequestControl.from_parameters({"sequence_id": huge})
    assert len(str(refused.value)) < 200  # the id is not echoed back
    for bad in ("a\nb", "a\r\nSet-Cookie: x", "tab\there", "nul\x00", "del\x7f", "é"):
        with pytest.raises(BadInput, match="only printable ASCII"):
            RequestControl.from_parameters({"sequence_id": bad})
    assert RequestControl.from_parameters({"sequence_id": "user 7: chat #1"}).sequence_id == "user 7: chat #1"


async def test_the_cap_is_a_model_setting(autojump_clock: trio.testing.MockClock) -> None:
    settings = recording_settings(sequence=SequenceSettings(max_id_length=8))
    async with actorserve.open_engine([settings]) as engine:
        assert (await engine.infer(seq("a", "12345678", start=True))).parameters["sequence_id"] == "12345678"
        with pytest.raises(BadInput, match=r"9 characters, over the limit of 8 \(sequence.max_id_length\)"):
            await engine.infer(seq("b", "123456789", start=True))
        with pytest.raises(BadInput, match="over the limit of 8"):
            await engine.infer(seq("c", "123456789", cancel=True))


# -- Retry-After -----------------------------------------------------------------------------


async def test_retry_after_tells_when_the_first_sequence_can_expire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = recording_settings(sequence=SequenceSettings(max_sequences=2, idle_timeout_ms=600_000))
    async with actorserve.open_engine([settings]) as engine:
        await engine.infer(seq("a", "a", start=True))
        await trio.sleep(100)
        await engine.infer(seq("b", "b", start=True))
        with pytest.raises(Overloaded, match=r"2 sequences are open \(max_sequences\)") as full:
            await engine.infer(seq("c", "c", start=True))
        assert full.value.retry_after == 500  # 'a' expires 600 s after it went idle
        await engine.infer(seq("a2", "a"))  # 'a' used again: now 'b' is first, at 700
        await trio.sleep(150)
        with pytest.raises(Overloaded) as full:
            await engine.infer(seq("c", "c", start=True))
        assert full.value.retry_after == 450
        await trio.sleep(451)  # 'b' expired: its slot is free
        assert (await engine.infer(seq("c", "c", start=True))).parameters["sequence_id"] == "c"


async def test_retry_after_is_at_least_1_and_bounded(autojump_clock: trio.testing.MockClock) -> None:
    never = recording_settings("never", sequence=SequenceSettings(max_sequences=1, idle_timeout_ms=0))
    far = recording_settings("far", sequence=SequenceSettings(max_sequences=1, idle_timeout_ms=86_400_000))
    total = recording_settings(
        "total", sequence=SequenceSettings(max_sequences=1, idle_timeout_ms=0, max_duration_ms=30_000)
    )
    async with actorserve.open_engine([never, far, total]) as engine:
        for name, expected in (("never", 1), ("far", 3600), ("total", 30)):
            await engine.infer(seq("a", "a", start=True), model=name)
            with pytest.raises(Overloaded) as full:
                await engine.infer(seq("b", "b", start=True), model=name)
            assert full.value.retry_after == expected, name


# -- bound to the token that opened it ------------------------------------------------------


async def test_a_bound_sequence_is_unknown_to_every_other_token(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with actorserve.open_engine([recording_settings()]) as engine:
        await engine.infer(seq("open", "s", owner="A", start=True))
        for flags in ({}, {"end": True}, {"cancel": True}):
            with pytest.raises(SequenceNotFound) as other:
                await engine.infer(seq("steal", "s", owner="B", **flags))
            assert str(other.value) == unknown("s")
        with pytest.raises(SequenceNotFound) as anonymous:
            await engine.infer(seq("steal", "s"))
        assert str(anonymous.value) == unknown("s")
        assert (await engine.infer(seq("mine", "s", owner="A", end=True))).parameters["sequence_id"] == "s"
        # once it ended, its owner is told why; anyone else hears nothing more than "unknown"
        with pytest.raises(SequenceNotFound, match="'s' has ended"):
            await engine.infer(seq("late", "s", owner="A"))
        with pytest.raises(SequenceNotFound) as other:
            await engine.infer(seq("late", "s", owner="B"))
        assert str(other.value) == unknown("s")
        model = engine.model("rec")
        assert isinstance(model, RecordingModel)
        assert model.ended == [("s@A", "ended")]  # the model knows it by (id, owner)


def total(response: actorserve.InferenceResponse) -> int:
    """The recording model's count of its sequence's responses so far."""
    return int(response.outputs[1].data[-1])


def counted(
    request_id: str, sid: str, owner: str, n_tokens: int, **flags: Any
) -> actorserve.InferenceRequest:
    """A request of ``owner``'s sequence ``sid`` that adds ``n_tokens`` to its count."""
    made = seq(request_id, sid, owner=owner, **flags)
    made.parameters["n_tokens"] = n_tokens
    return made


async def test_each_token_has_its_own_id_space(autojump_clock: trio.testing.MockClock) -> None:
    """Issue 30 finding 9: another token's start of an open id is no oracle (it used to
    answer 409): it opens that token's own sequence, and the two never meet."""
    a, b = "a" * 32, "b" * 32
    async with actorserve.open_engine([recording_settings()]) as engine:
        opened = [
            await engine.infer(counted("a1", "s", a, 2, start=True)),
            await engine.infer(counted("b1", "s", b, 5, start=True)),
        ]
        again = [await engine.infer(counted("a2", "s", a, 1)), await engine.infer(counted("b2", "s", b, 1))]
        # a third token, and no token, hear what an id nobody holds is told
        for owner in ("c" * 32, None):
            for flags in ({}, {"end": True}, {"cancel": True}):
                with pytest.raises(SequenceNotFound) as held:
                    await engine.infer(seq("c", "s", owner=owner, **flags))
                with pytest.raises(SequenceNotFound) as never:
                    await engine.infer(seq("c", "t", owner=owner, **flags))
                assert str(held.value) == str(never.value).replace("'t'", "'s'") == unknown("s")
        # each owner's own start of its open id is still a conflict, told to it alone
        with pytest.raises(actorserve.SequenceConflict, match="'s' is already open"):
            await engine.infer(seq("a3", "s", owner=a, start=True))
        ended = await engine.infer(seq("b3", "s", owner=b, end=True))
        with pytest.raises(SequenceNotFound, match="'s' has ended"):
            await engine.infer(seq("b4", "s", owner=b))
        assert total(await engine.infer(seq("a4", "s", owner=a))) == 4  # A's is open on
        model = engine.model("rec")
    assert [r.parameters["sequence_id"] for r in [*opened, *again, ended]] == ["s"] * 5
    assert [total(r) for r in opened + again] == [2, 5, 3, 6]
    assert isinstance(model, RecordingModel)
    assert model.states == [f"s@{a[:12]}", f"s@{b[:12]}"]
    assert model.ended == [(f"s@{b[:12]}", "ended"), (f"s@{a[:12]}", "shutdown")]


async def test_what_the_model_echoes_names_the_clients_id(autojump_clock: trio.testing.MockClock) -> None:
    """A model sees a bound sequence by its own id (in ``new_state`` and the request's
    ``sequence_id``); where it echoes that id, or names it in an error, the client reads
    its own id."""
    seen: list[object] = []

    class Echo(RecordingModel):
        def begin(self, request: actorserve.InferenceRequest, state: Any) -> Any:
            seen.append(request.parameters.get("sequence_id"))
            if request.parameters.get("n_tokens") == 0:
                raise BadInput(f"sequence {state.sequence_id!r} refuses")
            return super().begin(request, state)

        def step(self, batch: list[Any]) -> list[Any]:
            outputs = super().step(batch)
            for work, output in zip(batch, outputs, strict=True):
                if output.response is not None:
                    output.response.parameters.update(
                        sequence_id=work.state.sequence_id, echo=work.state.sequence_id
                    )
            return outputs

    a = "a" * 32
    async with actorserve.open_engine([recording_settings(implementation=Echo)]) as engine:
        opened = await engine.infer(seq("a1", "s", owner=a, start=True))
        with pytest.raises(BadInput) as refused:
            await engine.infer(counted("a2", "s", a, 0))
        unbound = await engine.infer(seq("u", "s", start=True))
    assert seen == [f"s@{a[:12]}", f"s@{a[:12]}", "s"]
    assert (opened.parameters["sequence_id"], opened.parameters["echo"]) == ("s", "s")
    assert str(refused.value) == "sequence 's' refuses"
    assert (unbound.parameters["sequence_id"], unbound.parameters["echo"]) == ("s", "s")


async def test_the_model_never_sees_the_owner(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[dict[str, Any]] = []

    class Peek(RecordingModel):
        def begin(self, request: actorserve.InferenceRequest, state: Any) -> Any:
            seen.append(dict(request.parameters))
            return super().begin(request, state)

    async with actorserve.open_engine([recording_settings(implementation=Peek)]) as engine:
        await engine.infer(seq("a", "s", owner="A", start=True))
        await engine.infer(seq("b", owner="A"))  # not a sequence: stripped all the same
    assert [OWNER_PARAMETER in params for params in seen] == [False, False]


async def test_a_token_holds_at_most_max_sequences_per_token(autojump_clock: trio.testing.MockClock) -> None:
    sequence = SequenceSettings(max_sequences=10, max_sequences_per_token=2, idle_timeout_ms=60_000)
    async with actorserve.open_engine([recording_settings(sequence=sequence)]) as engine:
        await engine.infer(seq("a1", "a1", owner="A", start=True))
        await trio.sleep(20)
        await engine.infer(seq("a2", "a2", owner="A", start=True))
        with pytest.raises(Overloaded, match=r"holds 2 open sequences \(max_sequences_per_token\)") as capped:
            await engine.infer(seq("a3", "a3", owner="A", start=True))
        assert capped.value.retry_after == 40  # a1 expires 60 s after it opened
        # another token is not held back by A's
        await engine.infer(seq("b1", "b1", owner="B", start=True))
        await engine.infer(seq("b2", "b2", owner="B", start=True))
        # ending one of its own frees a place for A
        await engine.infer(seq("a1-end", "a1", owner="A", end=True))
        await engine.infer(seq("a3", "a3", owner="A", start=True))


async def test_eviction_never_takes_another_tokens_sequence(autojump_clock: trio.testing.MockClock) -> None:
    sequence = SequenceSettings(max_sequences=2, evict_idle=True, idle_timeout_ms=60_000)
    async with actorserve.open_engine([recording_settings(sequence=sequence)]) as engine:
        await engine.infer(seq("a1", "a1", owner="A", start=True))
        await engine.infer(seq("a2", "a2", owner="A", start=True))
        with pytest.raises(Overloaded, match=r"2 sequences are open \(max_sequences\)") as full:
            await engine.infer(seq("b1", "b1", owner="B", start=True))
        assert full.value.retry_after == 60
        await engine.infer(seq("a1", "a1", owner="A"))  # a2 is now A's least recently used
        await engine.infer(seq("a3", "a3", owner="A", start=True))
        with pytest.raises(SequenceNotFound, match="'a2' was evicted"):
            await engine.infer(seq("late", "a2", owner="A"))
        await engine.infer(seq("a1-again", "a1", owner="A"))


def test_binding_needs_auth_inference() -> None:
    with pytest.raises(BadSetting, match="bind_sequences_to_token needs auth_inference"):
        Settings(bind_sequences_to_token=True)
    assert Settings(bind_sequences_to_token=True, auth_inference=True, token="t").bind_sequences_to_token


async def test_a_model_never_sees_two_open_sequences_under_one_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An unbound id spelt like a bound sequence's model id, or two owners whose
    fingerprints begin alike, still give the model distinct ids (``#<n>`` added)."""
    a, a2 = "a" * 32, "a" * 12 + "f" * 20
    async with actorserve.open_engine([recording_settings()]) as engine:
        await engine.infer(seq("1", "s", owner=a, start=True))
        await engine.infer(seq("2", f"s@{a[:12]}", start=True))
        await engine.infer(seq("3", "s", owner=a2, start=True))
        totals = [
            total(await engine.infer(seq(f"again{i}", sid, owner=owner)))
            for i, (sid, owner) in enumerate([("s", a), (f"s@{a[:12]}", None), ("s", a2), ("s", a)])
        ]
        model = engine.model("rec")
        assert isinstance(model, RecordingModel)
        assert model.states == [f"s@{a[:12]}", f"s@{a[:12]}#1", f"s@{a[:12]}#2"]
        # an eviction names the model's id: it ends that one sequence only
        assert model.evict_sequence(f"s@{a[:12]}#1", "test")
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(SequenceNotFound, match=r"'s@aaaaaaaaaaaa' was evicted \(test\)"):
            await engine.infer(seq("late", f"s@{a[:12]}"))
        assert total(await engine.infer(seq("on", "s", owner=a))) == 4
    assert totals == [2, 2, 2, 3]
