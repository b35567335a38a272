"""``GET /v2/docs/dataplane.json``: a valid OpenAPI 3.1 document, assembled by the HTTP
host from every door's part, that lists exactly the routes the port serves (the
playground's page and files aside), each documented by the door that claims it, so the
doors and the document cannot drift apart."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from openapi_spec_validator import validate

from actorserve import open_engine
from actorserve.engine import Engine
from actorserve.server.doors import create_app
from actorserve.settings import Settings
from actorserve.transport.httphost import HttpHost
from actorserve.transport.httphost.openapi import DOCUMENT_PATH, OpenApiPart, document
from actorserve.transport.rest import OipRest
from actorserve.transport.rest.app import _RAW_METHODS

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}
SETTINGS = Settings(models=(), http_port=0, grpc_port=None)


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with open_engine(SETTINGS) as engine:
        yield engine


def operations(paths: dict[str, dict[str, object]]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path) for path, item in paths.items() for method in item if method in HTTP_METHODS
    }


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: "1" if m.group(1) == "version" else "nope", path)


def oip_served(app: HttpHost) -> set[tuple[str, str]]:
    """(method, path template) of every route the OIP door registers: Quart's rules and
    the raw-ASGI routes (each under /versions/{version}/ too)."""
    routes: set[tuple[str, str]] = set()
    quart = next(door for door in app.doors if isinstance(door, OipRest)).quart
    for rule in quart.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        routes |= {(method, path) for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
    for op, methods in _RAW_METHODS.items():
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            routes |= {(method, f"{prefix}/{op}") for method in methods}
    return routes


async def test_the_document_is_valid_openapi_3_1(engine: Engine) -> None:
    app = create_app(engine, SETTINGS)
    assert app.document["openapi"] == "3.1.0"
    validate(app.document)


async def test_the_oip_door_documents_every_route_it_registers_and_nothing_else(engine: Engine) -> None:
    app = create_app(engine, SETTINGS)
    oip = next(door for door in app.doors if isinstance(door, OipRest))
    assert operations(dict(oip.openapi().paths)) == oip_served(app)


async def test_every_documented_path_is_claimed_by_the_door_that_documents_it(engine: Engine) -> None:
    """A door documents only what it serves: the host would hand each of its paths to it."""
    app = create_app(engine, SETTINGS)
    for door in app.doors:
        for path in door.openapi().paths:
            assert app.door_for(concrete(path)) is door, (type(door).__name__, path)
    assert {DOCUMENT_PATH, "/metrics"} <= set(app.document["paths"])  # the host's own


async def test_every_documented_route_answers(engine: Engine) -> None:
    """Each documented operation is served (answered by its door, not a 404 for an
    unknown path or a 405), and a path beside them is not."""
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None, no_auth=True))
    oip = next(door for door in app.doors if isinstance(door, OipRest))
    others = operations(app.document["paths"]) - operations(dict(oip.openapi().paths))
    assert len(others) >= 20  # the OpenAI API, TorchServe's, the host's own
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for method, path in sorted(others):
            reply = await client.request(method, concrete(path), content=b"{}")
            assert reply.status_code != 405, (method, path, reply.text)
            assert "no such endpoint" not in reply.text, (method, path)
        for unknown in ("/v1/nothing", "/nothing"):
            assert "no such endpoint" in (await client.get(unknown)).text


async def test_management_routes_say_they_need_a_token(engine: Engine) -> None:
    paths = create_app(engine, SETTINGS).document["paths"]
    secured = {
        path
        for path, item in paths.items()
        for op in item.values()
        if isinstance(op, dict) and op.get("security")
    }
    assert secured == {path for path in paths if path.startswith(("/v2/repository/models/", "/models"))}
    assert len(secured) == 11  # 7 of the repository API, 4 of TorchServe's management API


async def test_operations_with_a_body_document_its_refusals(engine: Engine) -> None:
    """Every operation that takes a body says it may be refused: 413 past max_body_bytes
    (announced or read), 408 past read_timeout (tests/reliability/test_rel_badinput_*)."""
    paths = create_app(engine, SETTINGS).document["paths"]
    with_body = [
        (method, path, op)
        for path, item in paths.items()
        for method, op in item.items()
        if isinstance(op, dict) and "requestBody" in op
    ]
    assert len(with_body) >= 20
    assert [(m, p) for m, p, op in with_body if not {"408", "413"} <= set(op["responses"])] == []


async def test_the_server_serves_the_document(engine: Engine) -> None:
    app = create_app(engine, SETTINGS)
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        reply = await client.get(DOCUMENT_PATH)
        refused = await client.post(DOCUMENT_PATH)
    assert reply.status_code == 200
    assert reply.json() == app.document
    assert refused.status_code == 405


def test_two_parts_that_document_one_path_are_a_bug() -> None:
    item = {"get": {"summary": "x", "responses": {}}}
    with pytest.raises(ValueError, match="two doors document /x"):
        document([OpenApiPart({"/x": item}), OpenApiPart({"/x": item})])
    with pytest.raises(ValueError, match="schema S"):
        document([OpenApiPart({}, {"S": {"type": "string"}}), OpenApiPart({}, {"S": {"type": "object"}})])
