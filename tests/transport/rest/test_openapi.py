"""``GET /v2/docs/dataplane.json``: a valid OpenAPI 3.1 document that lists exactly the
routes the REST app serves (the playground's page and files aside), so the two cannot
drift apart."""

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
from actorserve.transport.rest import OipRest
from actorserve.transport.rest.app import _RAW_METHODS
from actorserve.transport.rest.openapi import DOCUMENT_PATH, openapi_document

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}

#: the OpenAI API's and TorchServe's routes, matched by path in transport/openai/routes.py
#: and transport/torchserve/ (no table): test_the_routes_matched_by_path_answer checks
#: that each is served
OPENAI_ROUTES = {
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
}
TORCHSERVE_ROUTES = {
    ("GET", "/ping"),
    *((m, p) for m in ("POST", "PUT") for p in ("/predictions/{model}", "/predictions/{model}/{version}")),
    ("POST", "/explanations/{model}"),
    ("POST", "/explanations/{model}/{version}"),
    ("GET", "/models"),
    ("POST", "/models"),
    *((m, p) for m in ("GET", "PUT", "DELETE") for p in ("/models/{model}", "/models/{model}/{version}")),
    ("PUT", "/models/{model}/{version}/set-default"),
}


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with open_engine(Settings(models=(), http_port=0, grpc_port=None)) as engine:
        yield engine


def documented() -> set[tuple[str, str]]:
    paths = openapi_document()["paths"]
    return {
        (method.upper(), path) for path, item in paths.items() for method in item if method in HTTP_METHODS
    }


def served(engine: Engine) -> set[tuple[str, str]]:
    """(method, path template) of every route the app registers: Quart's rules and the
    raw-ASGI routes (each under /versions/{version}/ too), and /metrics."""
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None))
    routes: set[tuple[str, str]] = {("GET", "/metrics"), *OPENAI_ROUTES, *TORCHSERVE_ROUTES}
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


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    assert document["openapi"] == "3.1.0"
    validate(document)


async def test_every_route_served_is_documented_and_nothing_else(engine: Engine) -> None:
    assert served(engine) - documented() == set()
    assert documented() - served(engine) == set()


def test_management_routes_say_they_need_a_token() -> None:
    paths = openapi_document()["paths"]
    secured = {
        path
        for path, item in paths.items()
        for op in item.values()
        if isinstance(op, dict) and op.get("security")
    }
    assert secured == {path for path in paths if path.startswith(("/v2/repository/models/", "/models"))}
    assert len(secured) == 11  # 7 of the repository API, 4 of TorchServe's management API


def test_operations_with_a_body_document_its_refusals() -> None:
    """Every operation that takes a body says it may be refused: 413 past max_body_bytes
    (announced or read), 408 past read_timeout (tests/reliability/test_rel_badinput_*)."""
    paths = openapi_document()["paths"]
    with_body = [
        (method, path, op)
        for path, item in paths.items()
        for method, op in item.items()
        if isinstance(op, dict) and "requestBody" in op
    ]
    assert len(with_body) >= 20
    assert [(m, p) for m, p, op in with_body if not {"408", "413"} <= set(op["responses"])] == []


async def test_the_routes_matched_by_path_answer(engine: Engine) -> None:
    """Each route of OPENAI_ROUTES and TORCHSERVE_ROUTES is served (answered by its API,
    not by the app's 404 for unknown paths), and a path beside them is not."""
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None, no_auth=True))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for method, path in sorted(OPENAI_ROUTES | TORCHSERVE_ROUTES):
            concrete = path.replace("{model}", "nope").replace("{version}", "1")
            reply = await client.request(method, concrete, content=b"{}")
            assert reply.status_code != 405, (method, path, reply.text)
            assert "no such endpoint" not in reply.text, (method, path)
        for unknown in ("/v1/nothing", "/nothing"):
            assert "no such endpoint" in (await client.get(unknown)).text


async def test_the_server_serves_the_document(engine: Engine) -> None:
    app = create_app(engine, Settings(models=(), http_port=0, grpc_port=None))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        reply = await client.get(DOCUMENT_PATH)
    assert reply.status_code == 200
    assert reply.json() == openapi_document()
