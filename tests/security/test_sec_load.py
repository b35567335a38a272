"""Issue 19, finding 2: a management request cannot make the server run other code, read
other files, call other hosts or read other environment variables than the operator's
model files say. Over REST ``load`` with ``parameters.config``, gRPC
``RepositoryModelLoad`` (Triton's ``config``) and TorchServe's register (REST and gRPC),
every key that names code, a path, a URL or a variable is refused (400 /
INVALID_ARGUMENT naming the key and the setting that allows it) and the model keeps its
own settings; the keys a model declares safe still load; the operator's
``allow_load_overrides`` lets the named keys through. Real servers on 127.0.0.1 port 0."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import grpc
import httpx
import pytest
import trio
import tritonclient.grpc as grpcclient
from support.servers import start_server
from tritonclient.utils import InferenceServerException

import actorserve.models
from actorserve.engine.repository import ModelRepository
from actorserve.model import Model
from actorserve.models import builtin_settings
from actorserve.proto.torchserve.org.pytorch.serve.grpc import management as ts_management
from actorserve.server.composition import Server, serve
from actorserve.settings import ModelSettings, Settings
from actorserve.types import InferenceRequest, InferenceResponse

T = TypeVar("T")
TIMEOUT = 30.0
PROXY = "actorserve.models.openai_proxy.OpenAIProxyModel"
#: the proxy's upstream as the operator set it (nothing listens there: it is never called)
UPSTREAM = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
TS_STATEFUL = Path(actorserve.models.__file__).parent / "ts_stateful"


class ParametersModel(Model):
    """Answers with its own ``parameters`` (so a test sees what a load changed); declares
    ``threshold`` safe to override."""

    overridable_parameters: ClassVar[frozenset[str]] = frozenset({"threshold"})

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        return self.response(request, [], dict(self.parameters))


def models() -> tuple[ModelSettings, ...]:
    ts_stateful = [m for m in builtin_settings() if m.name == "ts_stateful"]
    return (
        *ts_stateful,
        ModelSettings(name="proxy", implementation=PROXY, parameters={"extra": UPSTREAM}),
        ModelSettings(
            name="params", implementation=ParametersModel, parameters={"threshold": 1, "path": "/srv/a"}
        ),
    )


Launch = Callable[..., Any]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """The model store (the one model folder), with a copy of the ts_stateful folder."""
    folder = tmp_path / "store"
    folder.mkdir()
    shutil.copytree(TS_STATEFUL, folder / "stateful")
    return folder


@pytest.fixture
def launch(nursery: trio.Nursery, store: Path) -> Launch:
    """``await launch(**settings_changes)``: REST and gRPC on port 0, no token needed
    (the load checks hold with and without one), ``store`` as the model folder."""

    async def start(**changes: Any) -> Server:
        values: dict[str, Any] = {"http_port": 0, "grpc_port": 0, "host": "127.0.0.1", "models": models()}
        values["no_auth"] = True
        values.update(changes)
        server: Server = await nursery.start(
            partial(serve, Settings(**values), repository=ModelRepository((store,)))
        )
        return server

    return start


async def in_thread(fn: Callable[[], T]) -> T:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


#: (model, parameters key, value): each names code, a path, a URL or an environment variable
SENSITIVE = [
    ("ts_stateful", "model_dir", "/tmp"),
    ("ts_stateful", "handler", "os:system"),
    ("ts_stateful", "manifest", {"model": {"handler": "/tmp/evil.py"}}),
    (
        "proxy",
        "extra",
        {"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": "ACTORSERVE_TOKEN"},
    ),
    ("params", "uri", "/etc/passwd"),
    ("params", "path", "/etc"),
]


def refusal(key: str) -> str:
    return f"(the server's operator can allow it: --allow-load-overrides {key} or ACTORSERVE_ALLOW_LOAD_OVERRIDES={key})"


async def test_rest_load_refuses_every_key_that_names_code_a_path_a_url_or_a_variable(launch: Launch) -> None:
    server = await launch()
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for model, key, value in SENSITIVE:
            before = (await client.get(f"/v2/repository/models/{model}")).json()
            body = {"parameters": {"config": {"parameters": {key: value}}}}
            answer = await client.post(f"/v2/repository/models/{model}/load", json=body)
            assert answer.status_code == 400, (model, key, answer.text)
            error = answer.json()["error"]
            assert error.startswith(
                f"model {model!r}: parameters.config.parameters: {key!r} cannot be set by a load request"
            )
            assert error.endswith(refusal(key))
            assert (await client.get(f"/v2/repository/models/{model}")).json() == before  # still the old one
        as_string = {"parameters": {"config": json.dumps({"parameters": {"model_dir": "/tmp"}})}}
        answer = await client.post("/v2/repository/models/ts_stateful/load", json=as_string)
        assert (answer.status_code, answer.json()["error"].endswith(refusal("model_dir"))) == (400, True)
        code = await client.post(
            "/v2/repository/models/params/load", json={"parameters": {"config": {"implementation": "os.X"}}}
        )
        assert code.status_code == 400 and "cannot set implementation" in code.json()["error"]


async def test_declared_and_always_safe_keys_still_load(launch: Launch) -> None:
    server = await launch()
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        body = {"parameters": {"config": {"parameters": {"threshold": 7}, "max_pending": 5}}}
        assert (await client.post("/v2/repository/models/params/load", json=body)).json() == {}
        answer = await client.post("/v2/models/params/infer", json={"inputs": []})
        assert answer.json()["parameters"] == {"threshold": 7, "path": "/srv/a"}
        # the one TorchServe's model declares
        timeout = {"parameters": {"config": {"parameters": {"response_timeout_s": 30}}}}
        assert (await client.post("/v2/repository/models/ts_stateful/load", json=timeout)).json() == {}
        version = {"parameters": {"config": {"parameters": {"version": "2"}}}}  # every model's
        assert (await client.post("/v2/repository/models/params/load", json=version)).json() == {}
        assert (await client.get("/v2/models/params/versions/2/ready")).status_code == 200


async def test_operator_setting_lets_the_named_keys_through(launch: Launch, tmp_path: Path) -> None:
    server = await launch(allow_load_overrides="path, model_dir")
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        body = {"parameters": {"config": {"parameters": {"path": "/srv/b"}}}}
        assert (await client.post("/v2/repository/models/params/load", json=body)).json() == {}
        answer = await client.post("/v2/models/params/infer", json={"inputs": []})
        assert answer.json()["parameters"] == {"threshold": 1, "path": "/srv/b"}
        elsewhere = shutil.copytree(TS_STATEFUL, tmp_path / "elsewhere")
        moved = {"parameters": {"config": {"parameters": {"model_dir": str(elsewhere)}}}}
        assert (await client.post("/v2/repository/models/ts_stateful/load", json=moved)).json() == {}
        uri = await client.post(
            "/v2/repository/models/params/load", json={"parameters": {"config": {"parameters": {"uri": "x"}}}}
        )
        assert uri.status_code == 400 and uri.json()["error"].endswith(refusal("uri"))  # only the named ones
    every = await launch(allow_load_overrides=("*",))
    async with httpx.AsyncClient(base_url=str(every.http_url), timeout=TIMEOUT) as client:
        body = {"parameters": {"config": {"parameters": {"uri": "x"}}}}
        assert (await client.post("/v2/repository/models/params/load", json=body)).json() == {}


async def test_grpc_repository_model_load_refuses_them_too(launch: Launch) -> None:
    server = await launch()
    assert server.grpc_address is not None
    host, port = server.grpc_address

    def scenario() -> list[tuple[str, str]]:
        client = grpcclient.InferenceServerClient(f"{host}:{port}")
        seen = []
        for model, key, value in SENSITIVE:
            try:
                client.load_model(model, config=json.dumps({"parameters": {key: value}}))
            except InferenceServerException as exc:
                seen.append((str(exc.status()), str(exc.message())))
            else:
                seen.append(("OK", ""))
        client.load_model("params", config=json.dumps({"parameters": {"threshold": 3}}))
        return seen

    seen = await in_thread(scenario)
    for (model, key, _), (status, message) in zip(SENSITIVE, seen, strict=True):
        assert status == "StatusCode.INVALID_ARGUMENT", (model, key, status, message)
        assert message.startswith(f"model {model!r}: parameters.config.parameters: {key!r} cannot be set")
        assert message.endswith(refusal(key))
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        answer = await client.post("/v2/models/params/infer", json={"inputs": []})
        assert answer.json()["parameters"]["threshold"] == 3


def register_over_grpc(address: tuple[str, int], **fields: Any) -> tuple[grpc.StatusCode, str]:
    """TorchServe's gRPC RegisterModel (a generic call with the committed messages)."""
    with grpc.insecure_channel(f"{address[0]}:{address[1]}") as channel:
        call = channel.unary_unary(
            "/org.pytorch.serve.grpc.management.ManagementAPIsService/RegisterModel",
            request_serializer=bytes,
            response_deserializer=ts_management.ManagementResponse.parse,
        )
        try:
            answer = call(ts_management.RegisterModelRequest(**fields), timeout=TIMEOUT)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, answer.msg


async def test_torchserve_register_stays_in_the_model_store(
    launch: Launch, tmp_path: Path, store: Path
) -> None:
    server = await launch()
    assert server.grpc_address is not None
    outside = shutil.copytree(TS_STATEFUL, tmp_path / "outside")
    urls = [str(outside), f"file://{outside}", "../outside", str(store / ".." / "outside")]
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for url in urls:
            answer = await client.post("/models", params={"url": url, "model_name": "evil"})
            assert answer.status_code == 400, (url, answer.text)
            assert answer.json()["message"] == (
                f"registering {url[len('file://') :] if url.startswith('file://') else url!r}: 'url' must name an "
                f"archive in the model store (one of the model folders) {refusal('url')}"
            )
            status, message = await in_thread(
                partial(register_over_grpc, server.grpc_address, url=url, model_name="x")
            )
            assert status == grpc.StatusCode.INVALID_ARGUMENT and message.endswith(refusal("url")), message
        handler = await client.post(
            "/models", params={"url": "stateful", "model_name": "evil", "handler": "os:system"}
        )
        assert handler.status_code == 400
        assert handler.json()["message"].startswith(
            "registering 'stateful': 'handler' cannot be set by a registration"
        )
        assert handler.json()["message"].endswith(refusal("handler"))
        status, message = await in_thread(
            partial(
                register_over_grpc,
                server.grpc_address,
                url="stateful",
                model_name="evil",
                handler="os:system",
            )
        )
        assert status == grpc.StatusCode.INVALID_ARGUMENT and message.endswith(refusal("handler")), message
        assert "evil" not in [m["modelName"] for m in (await client.get("/models")).json()["models"]]
        nul = await client.post("/models", params={"url": "stateful\x00", "model_name": "evil"})
        assert (nul.status_code, nul.json()["message"]) == (400, "model archive 'stateful\\x00' not found")
        # an archive (here a folder) of the store itself registers
        inside = await client.post("/models", params={"url": "stateful", "model_name": "inside"})
        assert inside.status_code == 200, inside.text


async def test_torchserve_register_outside_the_store_when_the_operator_allows(
    launch: Launch, tmp_path: Path
) -> None:
    server = await launch(allow_load_overrides=("url", "handler"))
    outside = shutil.copytree(TS_STATEFUL, tmp_path / "outside")
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        params = {"url": str(outside), "model_name": "outside", "handler": "stateful_handler"}
        answer = await client.post("/models", params=params)
        assert answer.status_code == 200, answer.text
        assert (await client.post("/predictions/outside", content=b"2")).text == "2"


def test_refusals_cross_the_engine_link(tmp_path: Path) -> None:
    """The multi-process shape: the engine process decides, the front answers its reason."""
    for name, settings in {
        "proxy": {"implementation": PROXY, "parameters": {"extra": UPSTREAM}},
        "plain": {
            "implementation": "actorserve.models.identity.IdentityModel",
            "parameters": {"uri": "/srv/a"},
        },
    }.items():
        (tmp_path / "store" / name).mkdir(parents=True)
        (tmp_path / "store" / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    outside = shutil.copytree(TS_STATEFUL, tmp_path / "outside")
    args = ("--http-port", "0", "--grpc-port", "off", "--api-workers", "2", "--no-auth")
    server = start_server(*args, "--allow-load-overrides", "uri", str(tmp_path / "store"))
    try:
        url = server.wait_for(r"processes: REST listening on (http://\S+)", 60)[1]
        with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
            ssrf = {"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": "ACTORSERVE_TOKEN"}
            body = {"parameters": {"config": {"parameters": {"extra": ssrf}}}}
            answer = client.post("/v2/repository/models/proxy/load", json=body)
            assert answer.status_code == 400 and answer.json()["error"].endswith(refusal("extra")), (
                answer.text
            )
            register = client.post("/models", params={"url": str(outside)})
            assert register.status_code == 400 and register.json()["message"].endswith(refusal("url")), (
                register.text
            )
            allowed = {"parameters": {"config": {"parameters": {"uri": "/srv/b"}}}}  # the operator named it
            assert client.post("/v2/repository/models/plain/load", json=allowed).json() == {}
    finally:
        server.stop()


#: issue 30, findings 1 and 12b: ``parameters.config`` values of another JSON type than the
#: object they stand for (pairs that dict() would turn into one, a string, a number)
NOT_OBJECTS = [
    ("ts_stateful", {"parameters": [["model_dir", "/tmp"], ["handler", "evil.py"]]}),
    ("proxy", {"parameters": [["extra", {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "HOME"}]]}),
    ("params", {"parameters": [["path", "/etc"]]}),
    ("params", {"parameters": '{"path": "/etc"}'}),
    ("params", {"parameters": 7}),
    ("params", {"sequence": [["max_queue", 1]]}),
    ("params", {"request": [["parameters", ["x"]]]}),
    ("params", {"max_pending": "5"}),
    ("params", {"workers": True}),
]


async def test_rest_load_refuses_values_that_are_not_the_object_they_stand_for(launch: Launch) -> None:
    server = await launch()
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        for model, config in NOT_OBJECTS:
            before = (await client.get(f"/v2/repository/models/{model}")).json()
            answer = await client.post(
                f"/v2/repository/models/{model}/load", json={"parameters": {"config": config}}
            )
            assert answer.status_code == 400, (model, config, answer.text)
            assert answer.json()["error"].startswith(f"model {model!r}: parameters.config"), answer.text
            assert (await client.get(f"/v2/repository/models/{model}")).json() == before
        # the config itself a JSON string of the same (Triton's spelling)
        for model, config in NOT_OBJECTS[:4]:
            body = {"parameters": {"config": json.dumps(config)}}
            answer = await client.post(f"/v2/repository/models/{model}/load", json=body)
            assert answer.status_code == 400, (model, config, answer.text)


async def test_grpc_load_refuses_values_that_are_not_the_object_they_stand_for(launch: Launch) -> None:
    server = await launch()
    assert server.grpc_address is not None
    host, port = server.grpc_address

    def scenario() -> list[tuple[str, str]]:
        client = grpcclient.InferenceServerClient(f"{host}:{port}")
        seen = []
        for model, config in NOT_OBJECTS:
            try:
                client.load_model(model, config=json.dumps(config))
            except InferenceServerException as exc:
                seen.append((str(exc.status()), str(exc.message())))
            else:
                seen.append(("OK", ""))
        return seen

    for (model, config), (status, message) in zip(NOT_OBJECTS, await in_thread(scenario), strict=True):
        assert status == "StatusCode.INVALID_ARGUMENT", (model, config, status, message)
        assert message.startswith(f"model {model!r}: parameters.config"), message
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=TIMEOUT) as client:
        answer = await client.post("/v2/models/params/infer", json={"inputs": []})
        assert answer.json()["parameters"] == {"threshold": 1, "path": "/srv/a"}
