"""TorchServe's REST inference API against the ``transformers`` runtime: the body is the
prompt (text, or JSON with the request parameters), the stateful headers carry a
sequence, and a continued sequence answers exactly what re-sending the history does."""

from __future__ import annotations

import json
import shlex
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from support.programs import require_program
from support.tiny_llm import build

from actorserve.modelsettings import model_settings_from_dict
from actorserve.server.composition import Server, serve
from actorserve.settings import Settings

pytest.importorskip("transformers")

SEQ_ID = "ts_request_sequence_id"
SEQ_START = "ts_request_sequence_start"
SEQ_END = "ts_request_sequence_end"
TIMEOUT = 60.0
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("ts_llm") / "llm", "llama", dtype="float32")


async def start(nursery: trio.Nursery, folder: Path) -> Server:
    data = {"name": "llm", "implementation": "transformers", "parameters": {"dtype": "float32"}}
    settings = Settings(
        models=(model_settings_from_dict(data, folder=folder),),
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        no_auth=True,
    )
    server: Server = await nursery.start(partial(serve, settings))
    return server


def text_of(reply: httpx.Response) -> str:
    """The generated text of a /predictions answer: one JSON document per streamed
    response (``{"text_output": [piece]}``), as TorchServe streams chunks."""
    assert reply.status_code == 200, reply.text
    decoder, body, at, text = json.JSONDecoder(), reply.text, 0, ""
    while at < len(body):
        doc, at = decoder.raw_decode(body, at)
        text += "".join(doc["text_output"])
    return text


async def predict(
    client: httpx.AsyncClient, prompt: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body: dict[str, Any] = {"text_input": prompt, **GREEDY}
    return await client.post("/predictions/llm", json=body, headers=headers or {})


async def test_a_sequence_through_the_stateful_headers_equals_resending_the_history(
    nursery: trio.Nursery, folder: Path
) -> None:
    server = await start(nursery, folder)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        first = await predict(client, "ROMEO:\n", {SEQ_ID: "chat", SEQ_START: "true"})
        assert first.headers[SEQ_ID] == "chat"
        said = "ROMEO:\n" + text_of(first)
        second = await predict(client, "JULIET:\nAy me", {SEQ_ID: "chat"})
        alone = await predict(client, said + "JULIET:\nAy me")
        assert text_of(second) == text_of(alone) != ""
        said += "JULIET:\nAy me" + text_of(second)
        # a text/plain body is the prompt, with the default parameters and the end header
        third = await client.post(
            "/predictions/llm",
            content=b" and thou",
            headers={"Content-Type": "text/plain", SEQ_ID: "chat", SEQ_END: "true"},
        )
        assert third.status_code == 200, third.text
        assert server.engine.model("llm").sequences == {}  # type: ignore[attr-defined]
        # the same id opens a new sequence (as TorchServe does): no history
        again = await predict(client, "JULIET:\nAy me", {SEQ_ID: "chat"})
        assert text_of(again) == text_of(await predict(client, "JULIET:\nAy me"))
        # the OIP generate route agrees with the TorchServe route, greedy
        oip = await client.post("/v2/models/llm/generate", json={"text_input": said, "parameters": GREEDY})
        assert oip.json()["text_output"] == text_of(await predict(client, said))


async def test_bad_bodies_are_400s_that_say_why(nursery: trio.Nursery, folder: Path) -> None:
    server = await start(nursery, folder)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        unknown = await client.post("/predictions/llm", json={"text_input": "x", "max_new_tokens": 3})
        assert unknown.status_code == 400
        assert "no parameter 'max_new_tokens'" in unknown.json()["message"]
        no_prompt = await client.post("/predictions/llm", json={"max_tokens": 3})
        assert no_prompt.status_code == 400
        assert "'text_input' or 'prompt'" in no_prompt.json()["message"]
        bad = await client.post("/predictions/llm", json={"prompt": "x", "max_tokens": -1})
        assert bad.status_code == 400 and "max_tokens" in bad.json()["message"]


def llm_md_curl() -> str:
    """docs/llm.md's /predictions curl command, joined onto one line."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "llm.md").read_text()
    block = doc.split("## TorchServe's inference API", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ")


async def test_the_docs_curl_sends_json_whose_parameters_count(nursery: trio.Nursery, folder: Path) -> None:
    """docs/llm.md's command as written (curl, its headers, its body): its parameters are
    read (a form body would drop them silently), and an unknown key is the promised 400."""
    require_program("curl", "docs/llm.md's command is run as written")
    server = await start(nursery, folder)
    command = llm_md_curl().replace("127.0.0.1:8080", server.http_url.removeprefix("http://"))
    command = command.replace("/predictions/gpt2", "/predictions/llm")
    args = [*shlex.split(command), "--silent", "--show-error", "--write-out", "\n%{http_code}"]
    done = await trio.run_process(args, capture_stdout=True, check=True)
    body, _, status = done.stdout.decode().rpartition("\n")
    assert status == "200", body
    got = text_of(httpx.Response(200, text=body))
    payload = json.loads(shlex.split(command)[-1])
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        alone = await client.post("/predictions/llm", json=payload)
    assert got == text_of(alone)  # the same tokens as the JSON sent by httpx: max_tokens counted
    unknown = json.dumps({**payload, "max_new_tokens": 3})
    args = [*shlex.split(command)[:-1], unknown, "--silent", "--write-out", "\n%{http_code}"]
    args = [a for a in args if "ts_request_sequence" not in a]
    done = await trio.run_process(args, capture_stdout=True, check=True)
    body, _, status = done.stdout.decode().rpartition("\n")
    assert status == "400", body
    assert "no parameter 'max_new_tokens'" in json.loads(body)["message"]
