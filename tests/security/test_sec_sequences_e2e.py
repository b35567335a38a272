"""Sequence ids on a real server (issue 19, findings 4 and 7): the id cap on every door
(OIP REST body and header, gRPC ModelInfer and ModelStreamInfer, TorchServe REST, the
OpenAI API), the 429's ``Retry-After``, TorchServe's server-made ids, and sequences bound
to the token that opened them across REST and gRPC, in one process and in the fronts +
engine shape (``--api-workers 2``)."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import trio
import tritonclient.grpc as grpcclient
from e2e.conftest import TIMEOUT, rest_settings
from support.replicas import not_held_message
from support.servers import start_server
from tritonclient.utils import InferenceServerException

from actorserve.models import builtin_settings
from actorserve.server.composition import Server, serve
from actorserve.settings import ModelSettings, SequenceSettings
from actorserve.transport.owner import fingerprint

TOKENS = ("token-of-alice-0123456789", "token-of-bob-9876543210", "token-of-carol-5555555555")
ALICE = {"Authorization": f"Bearer {TOKENS[0]}"}
BOB = {"Authorization": f"Bearer {TOKENS[1]}"}
CAROL = {"Authorization": f"Bearer {TOKENS[2]}"}
LONG = "x" * 129
CAP = "129 characters, over the limit of 128 (sequence.max_id_length)"


def add(value: int) -> dict[str, Any]:
    """An accumulator request body."""
    return {"inputs": [{"name": "INPUT", "shape": [1], "datatype": "INT64", "data": [value]}]}


def models(**sequence: Any) -> tuple[ModelSettings, ...]:
    """The light built-ins; the accumulator with ``sequence`` settings if given."""
    chosen = []
    for m in builtin_settings():
        if m.name == "accumulator" and sequence:
            m = ModelSettings(
                name=m.name, implementation=m.implementation, sequence=SequenceSettings(**sequence)
            )
        if m.name in ("identity", "streamer", "accumulator", "ts_stateful"):
            chosen.append(m)
    return tuple(chosen)


async def start(nursery: trio.Nursery, **changes: Any) -> Server:
    settings = rest_settings(**{"grpc_port": 0, "models": models(), **changes})
    server: Server = await nursery.start(partial(serve, settings))
    return server


def grpc_target(server: Server) -> str:
    assert server.grpc_address is not None
    return "{}:{}".format(*server.grpc_address)


def grpc_add(
    c: grpcclient.InferenceServerClient,
    value: int,
    sequence_id: Any,
    headers: dict[str, str] | None = None,
    **flags: Any,
) -> str:
    """ModelInfer on the accumulator: 'OK <sum>' or '<status> <message>'."""
    one = grpcclient.InferInput("INPUT", [1], "INT64")
    one.set_data_from_numpy(np.array([value], dtype=np.int64))
    try:
        result = c.infer("accumulator", [one], sequence_id=sequence_id, headers=headers, **flags)
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}"
    return f"OK {int(result.as_numpy('OUTPUT')[0])}"


# -- the id cap on every door ----------------------------------------------------------------


async def test_an_over_long_id_is_refused_400_on_every_rest_door(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        body = {**add(1), "parameters": {"sequence_id": LONG, "sequence_start": True}}
        oip_body = await client.post("/v2/models/accumulator/infer", json=body)
        oip_header = await client.post(
            "/v2/models/accumulator/infer",
            json=add(1),
            headers={"sequence-id": LONG, "sequence-start": "true"},
        )
        control = await client.post(
            "/v2/models/accumulator/infer", json={**add(1), "parameters": {"sequence_id": "a\u0001b"}}
        )
        ts = await client.post(
            "/predictions/ts_stateful", content=b"1", headers={"ts_request_sequence_id": LONG}
        )
        ai = await client.post(
            "/v1/completions",
            json={"model": "streamer", "prompt": "hi", "sequence_id": LONG, "sequence_start": True},
        )
    for reply in (oip_body, oip_header):
        assert (reply.status_code, reply.json()) == (400, {"error": f"parameter 'sequence_id': {CAP}"})
        assert "sequence-id" not in reply.headers
    assert control.status_code == 400 and "only printable ASCII" in control.json()["error"]
    assert ts.status_code == 400 and CAP in ts.json()["message"], ts.text
    assert ai.status_code == 400 and CAP in ai.json()["error"]["message"], ai.text


async def test_an_over_long_id_is_refused_invalid_argument_over_grpc(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    target = grpc_target(server)

    def scenario() -> tuple[str, str]:
        with grpcclient.InferenceServerClient(target) as c:
            unary = grpc_add(c, 1, LONG, sequence_start=True)
            errors: list[Any] = []
            c.start_stream(callback=lambda result, error: errors.append(error))
            one = grpcclient.InferInput("INPUT", [1], "INT64")
            one.set_data_from_numpy(np.array([1], dtype=np.int64))
            c.async_stream_infer("accumulator", [one], sequence_id=LONG, sequence_start=True)
            c.stop_stream()
        (error,) = errors
        return unary, error.message()  # an in-band error of the stream: no status of its own

    unary, streamed = await trio.to_thread.run_sync(scenario)
    assert unary == f"StatusCode.INVALID_ARGUMENT parameter 'sequence_id': {CAP}"
    assert streamed == f"parameter 'sequence_id': {CAP}"


# -- server-made ids and Retry-After ----------------------------------------------------------


async def test_server_made_ids_over_rest_grpc_and_torchserve(nursery: trio.Nursery) -> None:
    server = await start(nursery)
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        oip = await client.post(
            "/v2/models/accumulator/infer", json=add(1), headers={"sequence-start": "true"}
        )
        ts = await client.post("/predictions/ts_stateful", content=b"1")
    assert re.fullmatch(r"[A-Za-z0-9.-]{1,32}_[0-9a-f]{32}", oip.headers["sequence-id"])
    assert ts.status_code == 200, ts.text
    made = ts.headers["ts_request_sequence_id"]
    assert re.fullmatch(r"ts-seq-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", made), made


async def test_429_says_when_a_sequence_slot_can_free(nursery: trio.Nursery) -> None:
    server = await start(nursery, models=models(max_sequences=1, idle_timeout_ms=600_000))
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        opened = await client.post(
            "/v2/models/accumulator/infer", json=add(1), headers={"sequence-start": "true"}
        )
        full = await client.post(
            "/v2/models/accumulator/infer", json=add(1), headers={"sequence-start": "true"}
        )
    assert opened.status_code == 200
    assert full.status_code == 429 and "(max_sequences)" in full.json()["error"]
    assert 590 <= int(full.headers["retry-after"]) <= 600  # not 1: the only slot frees in 10 minutes


# -- bound to the token that opened it --------------------------------------------------------


def token_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text("\n".join(TOKENS) + "\n")
    return str(path)


async def test_a_bound_sequence_answers_only_its_token_on_rest_and_grpc(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start(
        nursery,
        no_auth=False,
        auth_inference=True,
        bind_sequences_to_token=True,
        token_file=token_file(tmp_path),
    )
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:

        async def post(headers: dict[str, str], value: int = 1, **params: Any) -> httpx.Response:
            return await client.post(
                "/v2/models/accumulator/infer", json={**add(value), "parameters": params}, headers=headers
            )

        opened = await post(ALICE, 5, sequence_start=True)
        sid = opened.headers["sequence-id"]
        never = await post(BOB, sequence_id="f" * 32)
        stolen = [
            await post(BOB, sequence_id=sid),
            await post(BOB, sequence_id=sid, sequence_end=True),
            await post(BOB, sequence_id=sid, sequence_cancel=True),
            # a client cannot name the owner itself: the server sets it from the token
            await post(BOB, sequence_id=sid, sequence_owner=fingerprint(TOKENS[0].encode())),
        ]
        mine = await post(ALICE, 2, sequence_id=sid)
    assert never.status_code == 404
    for reply in stolen:
        assert reply.status_code == 404
        assert reply.json()["error"] == never.json()["error"].replace("f" * 32, sid)
    assert (mine.status_code, mine.json()["outputs"][0]["data"]) == (200, [7])

    def stream(c: grpcclient.InferenceServerClient, headers: dict[str, str], value: int, **flags: Any) -> str:
        """One ModelStreamInfer request: 'OK <sum>' or the in-band error's message."""
        results: list[str] = []

        def seen(result: Any, error: Any) -> None:
            results.append(error.message() if error else f"OK {int(result.as_numpy('OUTPUT')[0])}")

        c.start_stream(callback=seen, headers=headers)
        one = grpcclient.InferInput("INPUT", [1], "INT64")
        one.set_data_from_numpy(np.array([value], dtype=np.int64))
        c.async_stream_infer("accumulator", [one], sequence_id=sid, **flags)
        c.stop_stream()
        (result,) = results
        return result

    def over_grpc() -> list[str]:
        with grpcclient.InferenceServerClient(grpc_target(server)) as c:
            alice, bob = {"authorization": ALICE["Authorization"]}, {"authorization": BOB["Authorization"]}
            return [
                grpc_add(c, 1, sid, bob),
                stream(c, bob, 1),
                stream(c, alice, 2),
                grpc_add(c, 1, sid, alice, sequence_end=True),
            ]

    unknown = not_held_message(sid)
    # the same token over gRPC (unary and streamed) is the same owner
    assert await trio.to_thread.run_sync(over_grpc) == [
        f"StatusCode.NOT_FOUND {unknown}",
        unknown,
        "OK 9",
        "OK 10",
    ]


async def test_unbound_sequences_answer_any_token(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start(nursery, no_auth=False, auth_inference=True, token_file=token_file(tmp_path))
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        opened = await client.post(
            "/v2/models/accumulator/infer", json=add(5), headers={**ALICE, "sequence-start": "true"}
        )
        other = await client.post(
            "/v2/models/accumulator/infer",
            json=add(2),
            headers={**BOB, "sequence-id": opened.headers["sequence-id"]},
        )
    assert (other.status_code, other.json()["outputs"][0]["data"]) == (200, [7])


async def test_a_token_over_its_cap_gets_429_naming_it(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start(
        nursery,
        no_auth=False,
        auth_inference=True,
        bind_sequences_to_token=True,
        token_file=token_file(tmp_path),
        models=models(max_sequences_per_token=1, idle_timeout_ms=60_000),
    )
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        start_one = partial(client.post, "/v2/models/accumulator/infer", json=add(1))
        first = await start_one(headers={**ALICE, "sequence-start": "true"})
        capped = await start_one(headers={**ALICE, "sequence-start": "true"})
        bob = await start_one(headers={**BOB, "sequence-start": "true"})
    assert (first.status_code, bob.status_code) == (200, 200)
    assert capped.status_code == 429
    assert "this token holds 1 open sequences (max_sequences_per_token)" in capped.json()["error"]
    assert 55 <= int(capped.headers["retry-after"]) <= 60


def test_binding_holds_across_the_fronts_and_the_engine_process(tmp_path: Path) -> None:
    tokens = token_file(tmp_path)
    server = start_server(
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--api-workers",
        "2",
        "--auth-inference",
        "--bind-sequences-to-token",
        "--token-file",
        tokens,
    )
    try:
        server.wait_for(r"serving with 2 front process", 60)
        url = server.wait_for(r"processes: REST listening on (http://\S+)")[1]
        target = server.wait_for(r"processes: gRPC listening on (\S+)")[1]
        replies = []
        for headers in (ALICE, BOB, ALICE):  # new connections: both fronts
            with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
                if not replies:
                    opened = client.post(
                        "/v2/models/accumulator/infer",
                        json=add(5),
                        headers={**headers, "sequence-start": "true"},
                    )
                    sid = opened.headers["sequence-id"]
                replies.append(
                    client.post(
                        "/v2/models/accumulator/infer", json=add(1), headers={**headers, "sequence-id": sid}
                    )
                )
        with grpcclient.InferenceServerClient(target) as c:
            bob_grpc = grpc_add(c, 1, sid, {"authorization": BOB["Authorization"]})
            alice_grpc = grpc_add(c, 1, sid, {"authorization": ALICE["Authorization"]})
    finally:
        server.stop()
    assert [r.status_code for r in replies] == [200, 404, 200]
    assert json.loads(replies[2].content)["outputs"][0]["data"] == [7]
    assert bob_grpc.startswith("StatusCode.NOT_FOUND") and alice_grpc == "OK 8"


async def test_a_bound_sequence_answers_only_its_token_on_torchserve(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start(
        nursery,
        no_auth=False,
        auth_inference=True,
        bind_sequences_to_token=True,
        token_file=token_file(tmp_path),
    )
    seq_id = "ts_request_sequence_id"
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:
        opened = await client.post("/predictions/ts_stateful", content=b"2", headers=ALICE)
        sid = opened.headers[seq_id]
        # Bob's request never reaches Alice's sequence: TorchServe's door opens the id
        # for him, as it would an id nobody holds (his own sequence, not a 409)
        bob = await client.post("/predictions/ts_stateful", content=b"4", headers={**BOB, seq_id: sid})
        alice = await client.post("/predictions/ts_stateful", content=b"4", headers={**ALICE, seq_id: sid})
    assert (opened.status_code, opened.text) == (200, "2")
    assert (bob.status_code, bob.text, bob.headers[seq_id]) == (200, "4", sid)
    assert (alice.status_code, alice.text) == (200, "6")  # Bob's 4 was never added


# -- issue 30, finding 9: no oracle of the ids other tokens hold -----------------------------


async def bound_server(nursery: trio.Nursery, tmp_path: Path) -> Server:
    return await start(
        nursery,
        no_auth=False,
        auth_inference=True,
        bind_sequences_to_token=True,
        token_file=token_file(tmp_path),
    )


async def test_two_tokens_open_one_id_apart_over_rest(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Another token's start of an open id used to answer 409 (telling that the id is
    in use): now each token opens its own sequence of that id; a third token's request
    for it is answered as for an id nobody holds."""
    server = await bound_server(nursery, tmp_path)
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:

        async def post(headers: dict[str, str], value: int = 1, **params: Any) -> httpx.Response:
            return await client.post(
                "/v2/models/accumulator/infer", json={**add(value), "parameters": params}, headers=headers
            )

        replies = [
            await post(ALICE, 5, sequence_id="s", sequence_start=True),
            await post(BOB, 100, sequence_id="s", sequence_start=True),
            await post(ALICE, 2, sequence_id="s"),
            await post(BOB, 20, sequence_id="s"),
        ]
        by_header = await client.post(
            "/v2/models/accumulator/infer", json=add(3), headers={**BOB, "sequence-id": "s"}
        )
        other = {}
        for name, params in (
            ("continue", {}),
            ("end", {"sequence_end": True}),
            ("cancel", {"sequence_cancel": True}),
        ):
            other[name] = (
                await post(CAROL, sequence_id="s", **params),
                await post(CAROL, sequence_id="t", **params),
            )
    assert [(r.status_code, r.json()["outputs"][0]["data"]) for r in replies] == [
        (200, [5]),
        (200, [100]),
        (200, [7]),
        (200, [120]),
    ]
    assert (by_header.json()["outputs"][0]["data"], by_header.headers["sequence-id"]) == ([123], "s")
    for reply in [*replies, by_header]:
        assert (reply.headers["sequence-id"], reply.json()["parameters"]["sequence_id"]) == ("s", "s")
        assert "@" not in reply.text
    for held, never in other.values():
        assert held.status_code == never.status_code == 404
        assert held.content == never.content.replace(b"'t'", b"'s'")


def grpc_sum(
    c: grpcclient.InferenceServerClient, headers: dict[str, str], value: int, sequence_id: str, **flags: Any
) -> tuple[str, str]:
    """ModelInfer on the accumulator: ('OK <sum>', the sequence id the response names),
    or ('<status> <message>', '')."""
    one = grpcclient.InferInput("INPUT", [1], "INT64")
    one.set_data_from_numpy(np.array([value], dtype=np.int64))
    metadata = {"authorization": headers["Authorization"]}
    try:
        result = c.infer("accumulator", [one], sequence_id=sequence_id, headers=metadata, **flags)
    except InferenceServerException as exc:
        return f"{exc.status()} {exc.message()}", ""
    echoed = result.get_response().parameters["sequence_id"].string_param
    return f"OK {int(result.as_numpy('OUTPUT')[0])}", echoed


async def test_two_tokens_open_one_id_apart_over_grpc(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await bound_server(nursery, tmp_path)

    def calls() -> list[tuple[str, str]]:
        with grpcclient.InferenceServerClient(grpc_target(server)) as c:
            return [
                grpc_sum(c, ALICE, 5, "g", sequence_start=True),
                grpc_sum(c, BOB, 100, "g", sequence_start=True),
                grpc_sum(c, ALICE, 2, "g"),
                grpc_sum(c, BOB, 20, "g", sequence_end=True),
                grpc_sum(c, CAROL, 1, "g"),
                grpc_sum(c, CAROL, 1, "h"),
            ]

    *opened, carol_held, carol_never = await trio.to_thread.run_sync(calls)
    assert opened == [("OK 5", "g"), ("OK 100", "g"), ("OK 7", "g"), ("OK 120", "g")]
    assert carol_held == (carol_never[0].replace("'h'", "'g'"), "")
    assert carol_held[0] == f"StatusCode.NOT_FOUND {not_held_message('g')}"


async def test_two_tokens_open_one_id_apart_on_torchserve(nursery: trio.Nursery, tmp_path: Path) -> None:
    """TorchServe's door: each token's start of one id opens its own sequence; the
    handler (which keys its cache by the id it is given) keeps them apart; every
    header names the client's id; a third token's request without a start is
    answered as for an id nobody holds (the door opens it for that token)."""
    server = await bound_server(nursery, tmp_path)
    seq_id, seq_start = "ts_request_sequence_id", "ts_request_sequence_start"
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:

        async def predict(headers: dict[str, str], value: int, sid: str, **more: str) -> httpx.Response:
            return await client.post(
                "/predictions/ts_stateful",
                content=str(value).encode(),
                headers={**headers, seq_id: sid, **more},
            )

        replies = [
            await predict(ALICE, 2, "s", **{seq_start: "true"}),
            await predict(BOB, 40, "s", **{seq_start: "true"}),
            await predict(ALICE, 4, "s"),
            await predict(BOB, 20, "s"),
        ]
        held = await predict(CAROL, 6, "s")
        never = await predict(CAROL, 6, "t")
    assert [(r.status_code, r.text) for r in replies] == [(200, "2"), (200, "40"), (200, "6"), (200, "60")]
    for reply in [*replies, held]:
        assert reply.headers[seq_id] == "s"
        assert not any("@" in value for value in reply.headers.values()), reply.headers
    assert (held.status_code, held.content) == (never.status_code, never.content)
    # the same headers, the id apart (and the clock's Date)
    as_held = {k: "s" if v == "t" else v for k, v in never.headers.items() if k != "date"}
    assert {k: v for k, v in held.headers.items() if k != "date"} == as_held
    assert held.headers["ts_request_sequence_end"] == "s"  # the handler's echo, the client's id


async def test_two_tokens_chat_under_one_id_on_the_openai_api(nursery: trio.Nursery, tmp_path: Path) -> None:
    """The OpenAI door: each token's chat sequence "s" is its own (the text model keeps
    two conversations), the ``sequence-id`` header and ``sequence_id`` field name "s",
    and a third token is told what an id nobody holds is told."""
    text_model = tuple(m for m in builtin_settings() if m.name == "text")
    settings = rest_settings(
        models=text_model,
        no_auth=False,
        auth_inference=True,
        bind_sequences_to_token=True,
        token_file=token_file(tmp_path),
    )
    server: Server = await nursery.start(partial(serve, settings))
    async with httpx.AsyncClient(base_url=server.http_url or "", timeout=TIMEOUT) as client:

        async def chat(headers: dict[str, str], content: str, sid: str, **extra: Any) -> httpx.Response:
            body = {"model": "text", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
            return await client.post(
                "/v1/chat/completions", json={**body, **extra}, headers={**headers, "sequence-id": sid}
            )

        opened = [
            await chat(ALICE, "Speak, friend.", "s", sequence_start=True, seed=2),
            await chat(BOB, "Who is there?", "s", sequence_start=True, seed=2),
            await chat(ALICE, "Whither?", "s", seed=2),
        ]
        held, never = await chat(CAROL, "Hello", "s"), await chat(CAROL, "Hello", "t")
    for reply in opened:
        assert reply.status_code == 200, reply.text
        assert (reply.headers["sequence-id"], reply.json()["sequence_id"]) == ("s", "s")
        assert "@" not in reply.text
    # Alice's second turn was read against her own conversation, not Bob's
    assert opened[2].json()["usage"]["prompt_tokens"] == len("USER:\nWhither?\n\nASSISTANT:\n")
    assert held.status_code == never.status_code == 404
    assert held.content == never.content.replace(b"'t'", b"'s'")
