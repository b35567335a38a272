"""Issue 19, finding 9: model names are checked wherever one enters (one rule:
:func:`actorserve.modelsettings.check_name`), so a name can always be addressed in a path
and never forges a log line; and the access log escapes what a client sent."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
from e2e.grpc_fixtures import in_asyncio
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from support.rel_badinput import launch

from actorserve.modelsettings import (
    MAX_NAME_LENGTH,
    ModelSettings,
    SettingsError,
    check_name,
    discover_models,
)
from actorserve.proto.torchserve.org.pytorch.serve.grpc.management import (
    ManagementApIsServiceStub,
    RegisterModelRequest,
)
from actorserve.transport.access import escape, text_of

BAD_NAMES = [
    "a/b",
    "../x",
    "a\nb",
    "a b",
    ".hidden",
    "-x",
    "",
    "é",
    "x" * (MAX_NAME_LENGTH + 1),
    "a\\b",
    "m%2Fx",
]
GOOD_NAMES = [
    "identity",
    "ts_stateful",
    "no-such-model",
    "TYPED",
    "m",
    "0.1.0",
    "a.b-c_d",
    "x" * MAX_NAME_LENGTH,
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_name_is_a_settings_error_naming_the_rule(name: str) -> None:
    with pytest.raises(SettingsError, match="is not valid: use letters, digits"):
        ModelSettings(name=name or "x", implementation="x.Y", version="1" if name else "a/1")
    with pytest.raises(SettingsError, match="model name"):
        check_name(name)


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_the_names_in_use_stay_valid(name: str) -> None:
    assert ModelSettings(name=name, implementation="x.Y", version="1.0").name == name


def test_a_model_folder_with_a_bad_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model-settings.json").write_text(json.dumps({"name": "a/b", "implementation": "x.Y"}))
    with pytest.raises(SettingsError, match="'a/b' is not valid"):
        discover_models(tmp_path)


@pytest.mark.parametrize("name", ["a/b", "a\nb", "../evil", "x" * 200])
async def test_torchserve_register_refuses_a_bad_model_name(nursery: trio.Nursery, name: str) -> None:
    server = await launch(nursery)
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=10) as client:
        reply = await client.post("/models", params={"url": "identity.mar", "model_name": name})
        assert reply.status_code == 400, reply.text
        assert reply.json()["type"] == "BadRequestException"
        assert "is not valid: use letters, digits" in reply.json()["message"]
        assert (await client.get("/models")).status_code == 200

    assert server.grpc_address is not None
    host, port = server.grpc_address

    async def register() -> tuple[Status, str | None]:
        channel = Channel(host, port)
        try:
            await ManagementApIsServiceStub(channel).register_model(
                RegisterModelRequest(url="identity.mar", model_name=name)
            )
        except GRPCError as exc:
            return exc.status, exc.message
        finally:
            channel.close()
        return Status.OK, None

    status, message = await in_asyncio(register)
    assert status is Status.INVALID_ARGUMENT and "is not valid: use letters, digits" in (message or ""), (
        message
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("/v2/models/m/infer", "/v2/models/m/infer"),
        ("/x\n2026-01-01 INFO forged", "/x\\n2026-01-01\\x20INFO\\x20forged"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("a\\nb", "a\\\\nb"),  # a literal backslash cannot pass for an escape
        ("line\u2028sep", "line\\u2028sep"),
        ("é", "é"),
    ],
)
def test_access_log_fields_are_escaped(value: str, shown: str) -> None:
    assert escape(value) == shown
    line = text_of((0.0, "rest", value, value, 400, 0, 1.0, value, value, value))
    assert "\n" not in line and line.count(" ") == 8  # the fields' own separators only
    assert line.startswith(f"rest {shown} {shown} status=400")
    assert line.endswith(f"model={shown} version={shown} sequence={shown}")
