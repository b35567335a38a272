"""Hosts and doors: the hosts record every door's requests (metrics and the access log),
and a door defined here, in a test, gets auth, CORS, the drain, the metrics and the
access log from the HTTP host without touching any other door."""

from __future__ import annotations

import logging
import socket
from functools import partial
from typing import Any

import grpc
import httpx
import orjson
import pytest
import trio
from e2e.conftest import TIMEOUT
from openapi_spec_validator import validate
from support.scrape import parse, value

from actorserve.api import EngineAPI
from actorserve.metrics import Metrics
from actorserve.models import builtin_settings
from actorserve.proto.torchserve.org.pytorch.serve.grpc.inference import (
    PredictionResponse,
    PredictionsRequest,
)
from actorserve.server.composition import Server, serve
from actorserve.server.doors import http_doors
from actorserve.settings import Settings
from actorserve.transport.access import ACCESS_LOGGER, AccessLog
from actorserve.transport.auth import Guard, Scope
from actorserve.transport.exchange import Exchange, Recorder
from actorserve.transport.httphost import Drain, HttpHost
from actorserve.transport.httphost.openapi import DOCUMENT_PATH, OpenApiPart, ok, op, ref
from actorserve.transport.httphost.replies import ASGIApp, ASGIReceive, ASGIScope, ASGISend
from actorserve.transport.httphost.serve import serve_http

TOKEN = "door-test-token"
MODELS = tuple(m for m in builtin_settings() if m.name in ("streamer", "identity", "ts_stateful"))


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.access for r in caplog.records if r.name == ACCESS_LOGGER and hasattr(r, "access")]


async def test_every_door_is_in_the_request_metrics_and_the_access_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """OpenAI and TorchServe (REST and gRPC) requests count in ``actorserve_requests``
    under the model they name, as the OIP's do; a model that does not exist counts under
    ``model=""`` whichever door was asked."""
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    settings = Settings(
        models=MODELS, host="127.0.0.1", http_port=0, grpc_port=0, no_auth=True, access_log=True
    )
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(partial(serve, settings))
        assert server.grpc_address is not None
        async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
            completion = {"model": "streamer", "prompt": "a", "max_tokens": 3}
            assert (await client.post("/v1/completions", json=completion)).status_code == 200
            missing = {**completion, "model": "no-such-model"}
            assert (await client.post("/v1/completions", json=missing)).status_code == 404
            assert (await client.post("/predictions/ts_stateful", content=b"2")).status_code == 200
            assert (await client.post("/predictions/no-such-model", content=b"2")).status_code == 404
            target = "{}:{}".format(*server.grpc_address)

            def predict() -> Any:
                with grpc.insecure_channel(target) as channel:
                    call = channel.unary_unary(
                        "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
                        request_serializer=bytes,
                        response_deserializer=PredictionResponse.parse,
                    )
                    return call(
                        PredictionsRequest(model_name="ts_stateful", input={"body": b"3"}), timeout=TIMEOUT
                    )

            answer = await trio.to_thread.run_sync(predict)
            assert answer is not None and answer.prediction == b"3"
            samples = parse((await client.get("/metrics")).text)
        server.shutdown()  # the last access lines are flushed as the server stops

    def requests(model: str, transport: str, outcome: str) -> float:
        labels = {"model": model, "version": "", "transport": transport, "outcome": outcome}
        return value(samples, "actorserve_requests_total", **labels)

    assert requests("streamer", "rest", "success") == 1
    assert requests("", "rest", "invalid") == 2  # no such model: over OpenAI and TorchServe
    assert requests("ts_stateful", "rest", "success") == 1
    assert requests("ts_stateful", "grpc", "success") == 1
    routes = {(line["route"], line["status"], line["model"]) for line in access_lines(caplog)}
    assert {
        ("/v1/completions", 200, "streamer"),
        ("/v1/completions", 404, "no-such-model"),
        ("/predictions/ts_stateful", 200, "ts_stateful"),
        ("/predictions/no-such-model", 404, "no-such-model"),
        ("/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions", "OK", "ts_stateful"),
    } <= routes


class Healthz:
    """A door of its own: ``GET /healthz`` (open), ``GET /healthz/model`` (inference:
    it names a model, so it counts in the metrics), ``GET /healthz/wait`` (an event
    stream that waits for :attr:`release`). Its errors are ``{"healthz": message}``."""

    lifespan: ASGIApp | None = None

    def __init__(self, engine: EngineAPI) -> None:
        self.engine = engine
        self.release = trio.Event()
        self.waiting = trio.Event()

    @staticmethod
    def claims(path: str) -> bool:
        return path == "/healthz" or path.startswith("/healthz/")

    @staticmethod
    def auth_scope(path: str) -> Scope | None:
        return Scope.INFERENCE if path == "/healthz/model" else None

    @staticmethod
    def openapi() -> OpenApiPart:
        return OpenApiPart(
            {
                "/healthz": {"get": op("Is the server ready", ok(ref("Healthz")))},
                "/healthz/model": {"get": op("Is the identity model ready", ok(ref("Healthz")))},
                "/healthz/wait": {
                    "get": op("An event stream that waits", {"200": {"description": "events"}})
                },
            },
            {"Healthz": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
        )

    @staticmethod
    def bad_target(why: str) -> tuple[int, bytes]:
        return 400, orjson.dumps({"healthz": why})

    @staticmethod
    def forbidden(why: str) -> tuple[int, bytes]:
        return 403, orjson.dumps({"healthz": why})

    @staticmethod
    def shutting_down(message: str) -> tuple[int, bytes]:
        return 503, orjson.dumps({"healthz": message})

    @staticmethod
    def stream_end(method: str, path: str, message: str) -> bytes:
        return b"data: " + message.encode() + b"\n\n"

    async def serve(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend, exchange: Exchange) -> None:
        path = scope["path"]
        if path == "/healthz/wait":
            start = {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
            await send(start)
            await send({"type": "http.response.body", "body": b"data: waiting\n\n", "more_body": True})
            self.waiting.set()
            await self.release.wait()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if path == "/healthz/model":
            exchange.model_request("identity", None)
            ready = (await self.engine.model_info("identity")).ready
        else:
            ready = await self.engine.ready()
        body = orjson.dumps({"ok": ready})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def test_a_door_defined_in_a_test_gets_what_the_host_shares(caplog: pytest.LogCaptureFixture) -> None:
    """One door class and one more entry in the door list: the host gives it the token
    check by the scope it declares, CORS, the request metrics and the access log, the
    drain's 503 in its error shape and the end of its stream in its event shape, and
    its paths in the port's OpenAPI document; the other doors serve on beside it."""
    import actorserve

    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    settings = Settings(
        models=MODELS,
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        token=TOKEN,
        auth_inference=True,
        cors_allow_origin=("https://page.example",),
    )
    metrics = Metrics()
    access = AccessLog()
    recorder = Recorder(metrics, access)
    guard = Guard([TOKEN], inference=True)
    listener = socket.create_server(("127.0.0.1", 0))
    done, stopped = trio.Event(), trio.Event()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with listener:
        async with actorserve.open_engine(settings) as engine, trio.open_nursery() as nursery:
            await nursery.start(access.run)
            healthz = Healthz(engine)
            host = HttpHost(
                [healthz, *http_doors(engine, settings, recorder)], settings, recorder, guard=guard
            )
            drain = Drain(host, host.door_for)
            host_port = await nursery.start(serve_http, drain, listener, settings, done, stopped)
            base = "http://{}:{}".format(*host_port)
            async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as client:
                assert (await client.get("/healthz")).json() == {"ok": True}  # open
                documented = (await client.get(DOCUMENT_PATH)).json()
                assert {"/healthz", "/healthz/model", "/healthz/wait", "/v2/health/ready"} <= set(
                    documented["paths"]
                )
                assert "Healthz" in documented["components"]["schemas"]
                validate(documented)
                refused = await client.get("/healthz/model")  # inference: a token is needed
                assert (refused.status_code, refused.headers["www-authenticate"]) == (401, "Bearer")
                answer = await client.get(
                    "/healthz/model", headers={**auth, "Origin": "https://page.example"}
                )
                assert answer.json() == {"ok": True}
                assert answer.headers["access-control-allow-origin"] == "https://page.example"
                preflight = await client.options(
                    "/healthz/model",
                    headers={"Origin": "https://page.example", "Access-Control-Request-Method": "GET"},
                )
                assert preflight.status_code == 204
                bad = await client.get("/healthz/%2e%2e/x")
                assert (bad.status_code, bad.json()) == (400, {"healthz": bad.json()["healthz"]})
                # the other doors serve on beside it
                infer = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.5]}]}
                oip = await client.post("/v2/models/identity/infer", json=infer, headers=auth)
                assert oip.status_code == 200
                samples = parse((await client.get("/metrics")).text)
                labels = {"model": "identity", "version": "", "transport": "rest", "outcome": "success"}
                assert value(samples, "actorserve_requests_total", **labels) == 1

                async with client.stream("GET", "/healthz/wait") as stream:
                    chunks = stream.aiter_bytes()
                    assert await chunks.__anext__() == b"data: waiting\n\n"
                    drain.start()
                    refused = await client.get("/healthz")
                    assert (refused.status_code, refused.json()) == (
                        503,
                        {"healthz": "the server is shutting down"},
                    )
                    drain.end_all()  # the grace period is over: the stream ends in its door's shape
                    rest = b"".join([chunk async for chunk in chunks])
                    assert rest == b"data: the server is shutting down\n\n"
            done.set()
            await stopped.wait()
            nursery.cancel_scope.cancel()
    routes = [(line["route"], line["status"], line["model"]) for line in access_lines(caplog)]
    assert ("/healthz", 200, None) in routes
    assert ("/healthz/model", 401, None) in routes
    assert ("/healthz/model", 200, "identity") in routes
