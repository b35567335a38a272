"""``--sequence-headers``: a sequence's id in TorchServe's or SageMaker's headers instead
of ``sequence-id``, with real requests on both REST paths (the raw ASGI one and Quart's).
SageMaker's formats are its runtime API's: a session id matches ``SESSION_ID``, a new
session's answer ``NEW_SESSION_ANSWER``."""

from __future__ import annotations

import calendar
import re
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from actorserve.replica import made_by, new_sequence_id, not_held
from actorserve.settings import BadSetting, Settings
from actorserve.transport.rest.sequence_headers import NEVER, expires

if TYPE_CHECKING:
    from conftest import Launch

TIMEOUT = 20.0
URL = "/v2/models/accumulator/infer"
#: SageMaker runtime's SessionIdHeader and NewSessionResponseHeader patterns (max 256)
SESSION_ID = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
NEW_SESSION_ANSWER = re.compile(
    r"([a-zA-Z0-9](?:-*[a-zA-Z0-9])*);\sExpires=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"
)
SESSION = "X-Amzn-SageMaker-Session-Id"
NEW = "X-Amzn-SageMaker-New-Session-Id"
CLOSED = "X-Amzn-SageMaker-Closed-Session-Id"


def add(value: int, **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]}
    if parameters:
        body["parameters"] = parameters
    return body


def total(reply: httpx.Response) -> int:
    assert reply.status_code == 200, reply.text
    value: int = reply.json()["outputs"][0]["data"][0]
    return value


@pytest.mark.parametrize("fast_path", [True, False], ids=["raw", "quart"])
async def test_sagemaker_sessions_open_continue_and_close(launch: Launch, fast_path: bool) -> None:
    server = await launch(fast_path=fast_path, sequence_headers="sagemaker", replica_id="pod-1.zone")
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        before = time.time()
        opened = await client.post(URL, json=add(1), headers={SESSION: "NEW_SESSION"})
        assert total(opened) == 1
        answer = NEW_SESSION_ANSWER.fullmatch(opened.headers[NEW])
        assert answer is not None and len(opened.headers[NEW]) <= 256, opened.headers[NEW]
        session, expiry = answer[1], answer[2]
        assert SESSION_ID.fullmatch(session) and made_by(session) == "pod-1-zone"
        assert opened.json()["parameters"] == {"sequence_id": session}
        # the accumulator's sequences expire after 600 s idle
        at = calendar.timegm(time.strptime(expiry, "%Y-%m-%dT%H:%M:%SZ"))
        assert int(before) + 600 <= at <= time.time() + 601
        other = await client.post(URL, json=add(100), headers={SESSION: "NEW_SESSION"})
        other_id = NEW_SESSION_ANSWER.fullmatch(other.headers[NEW])[1]  # type: ignore[index]
        assert other_id != session
        later = await client.post(URL, json=add(2), headers={SESSION: session})
        assert (total(later), later.headers[SESSION]) == (3, session)
        assert NEW not in later.headers and CLOSED not in later.headers
        closed = await client.post(URL, json=add(3, sequence_end=True), headers={SESSION: session})
        assert (total(closed), closed.headers[CLOSED]) == (6, session)
        assert SESSION not in closed.headers
        gone = await client.post(URL, json=add(4), headers={SESSION: session})
        assert gone.status_code == 404 and "has ended" in gone.json()["error"]
        # the sequence-end header closes one as well; sequence-id is not read in this preset
        closed = await client.post(
            URL, json=add(5), headers={SESSION: other_id, "sequence-end": "true", "sequence-id": "x"}
        )
        assert (total(closed), closed.headers[CLOSED]) == (105, other_id)
        # a start asked for as a parameter (no NEW_SESSION) gets an id in SageMaker's format too
        by_parameter = await client.post(URL, json=add(7, sequence_start=True, sequence_cancel=False))
        made = NEW_SESSION_ANSWER.fullmatch(by_parameter.headers[NEW])
        assert made is not None and made_by(made[1]) == "pod-1-zone" and total(by_parameter) == 7
        cancelled = await client.post(URL, json=add(0, sequence_cancel=True), headers={SESSION: made[1]})
        assert cancelled.headers[CLOSED] == made[1]


async def test_sagemaker_new_session_disagreeing_with_the_body_is_refused(launch: Launch) -> None:
    server = await launch(sequence_headers="sagemaker")
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        reply = await client.post(URL, json=add(1, sequence_start=False), headers={SESSION: "NEW_SESSION"})
        assert reply.status_code == 400
        assert "disagrees with parameter 'sequence_start'" in reply.json()["error"]


@pytest.mark.parametrize("fast_path", [True, False], ids=["raw", "quart"])
async def test_a_sagemaker_session_id_outside_its_alphabet_is_refused(
    launch: Launch, fast_path: bool
) -> None:
    """Issue 30, finding 10: a client's id is echoed in the New-Session-Id header, where
    ``;``, ``=``, ``,`` or a space would forge attributes (``; Expires=...``); such an id,
    or one longer than SageMaker's 256, is refused 400 from the header and the body alike."""
    server = await launch(fast_path=fast_path, sequence_headers="sagemaker")
    forged = ["x; Expires=2099-01-01T00:00:00Z", "a=b", "a,b", "a b", "é", "x" * 257]
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for value in forged:
            in_body = await client.post(URL, json=add(1, sequence_id=value, sequence_start=True))
            assert in_body.status_code == 400, (value, in_body.text)
            assert "is not a session id" in in_body.json()["error"]
            assert NEW not in in_body.headers and SESSION not in in_body.headers
            if value.isascii():
                in_header = await client.post(URL, json=add(1, sequence_start=True), headers={SESSION: value})
                assert in_header.status_code == 400, (value, in_header.text)
        fine = await client.post(URL, json=add(1, sequence_id="my.session_1-a", sequence_start=True))
        assert total(fine) == 1 and fine.headers[NEW].startswith("my.session_1-a; Expires=")


async def test_a_sagemaker_session_of_another_replica_is_not_held(launch: Launch) -> None:
    server = await launch(sequence_headers="sagemaker", replica_id="r1")
    foreign = new_sequence_id("r2", sagemaker=True)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        reply = await client.post(URL, json=add(1), headers={SESSION: foreign})
    assert reply.status_code == 404
    assert reply.json() == {"error": not_held(foreign, "r1").message, "reason": "sequence_not_held"}
    assert "made by replica 'r2'" in reply.json()["error"]


@pytest.mark.parametrize("fast_path", [True, False], ids=["raw", "quart"])
async def test_torchserve_sequence_header(launch: Launch, fast_path: bool) -> None:
    server = await launch(fast_path=fast_path, sequence_headers="torchserve", replica_id="r1")
    header = "ts_request_sequence_id"
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        opened = await client.post(URL, json=add(4), headers={"sequence-start": "true"})
        sid = opened.headers[header]
        assert total(opened) == 4 and made_by(sid) == "r1" and "sequence-id" not in opened.headers
        chosen = await client.post(URL, json=add(7), headers={header: "chat-7", "sequence-start": "true"})
        assert (total(chosen), chosen.headers[header]) == (7, "chat-7")
        later = await client.post(URL, json=add(5), headers={header: sid, "sequence-end": "true"})
        assert (total(later), later.headers[header]) == (9, sid)


async def test_the_sse_stream_names_a_new_sagemaker_session(launch: Launch) -> None:
    server = await launch(sequence_headers="sagemaker")
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        url = "/v2/models/accumulator/infer_stream"
        async with client.stream("POST", url, json=add(2), headers={SESSION: "NEW_SESSION"}) as reply:
            assert reply.status_code == 200
            answer = NEW_SESSION_ANSWER.fullmatch(reply.headers[NEW])
            body = (await reply.aread()).decode()
        assert answer is not None and f'"sequence_id":"{answer[1]}"' in body


@pytest.mark.parametrize("fast_path", [True, False], ids=["raw", "quart"])
async def test_a_header_name_of_ones_own(launch: Launch, fast_path: bool) -> None:
    server = await launch(fast_path=fast_path, sequence_headers="X-Chat-Session")
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        opened = await client.post(URL, json=add(2), headers={"sequence-start": "true"})
        sid = opened.headers["x-chat-session"]
        later = await client.post(URL, json=add(3), headers={"x-chat-session": sid})
        assert (total(later), later.headers["X-Chat-Session"], "sequence-id" in later.headers) == (
            5,
            sid,
            False,
        )


@pytest.mark.parametrize("value", ["sequence-end", "Content-Length", "two words", "", "-x"])
def test_a_header_the_server_reads_otherwise_is_refused(value: str) -> None:
    with pytest.raises(BadSetting, match="sequence_headers must be oip, torchserve, sagemaker or a header"):
        Settings(sequence_headers=value)


def test_expires_is_sagemakers_utc_second() -> None:
    assert expires(600_000, now=0.0) == "1970-01-01T00:10:00Z"
    assert expires(0) == NEVER
