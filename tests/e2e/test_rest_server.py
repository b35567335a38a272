"""``serve()`` and ``python -m actorserve``: bound addresses, graceful shutdown within the
grace period, cancellation, signals, and the CLI's errors."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from actorserve.server.composition import ListenError, Listeners, Server, open_listeners, serve
from actorserve.settings import Settings

if TYPE_CHECKING:
    from conftest import GateModel

TIMEOUT = 20.0
ROOT = Path(__file__).resolve().parents[2]


def gate_body(rid: str, gate: str) -> dict[str, Any]:
    return {"id": rid, "inputs": [], "parameters": {"n_tokens": 1, "free": 0, "gate": gate}}


def gate_of(server: Server) -> GateModel:
    model: Any = server.engine.model("gate")
    return model  # type: ignore[no-any-return]


async def test_port_zero_reports_the_bound_port(launch: Callable[..., Awaitable[Server]]) -> None:
    server = await launch()
    assert server.http_address is not None
    host, port = server.http_address
    assert host == "127.0.0.1" and port > 0
    assert server.http_url == f"http://127.0.0.1:{port}"
    assert server.grpc_address is None
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{server.http_url}/v2/health/live")).status_code == 200


async def test_graceful_shutdown_finishes_in_flight_requests(make_settings: Callable[..., Settings]) -> None:
    replies: list[httpx.Response] = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            server: Server = await nursery.start(serve, make_settings(grace_period=TIMEOUT))
            url = str(server.http_url)
            gate = gate_of(server)

            async def in_flight() -> None:
                async with httpx.AsyncClient(base_url=url) as client:
                    replies.append(await client.post("/v2/models/gate/infer", json=gate_body("slow", "g")))

            nursery.start_soon(in_flight)
            await gate.started["slow"].wait()
            server.shutdown()
            assert server.stopping
            await trio.testing.wait_all_tasks_blocked()
            async with httpx.AsyncClient(base_url=url) as client:  # refused while draining
                refused = await client.get("/v2/health/live")
            assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
            assert refused.json() == {"error": "the server is shutting down"}
            gate.gates["g"].set()  # the request in flight still completes
        # serve() returned: the nursery is done
    assert [r.status_code for r in replies] == [200]
    assert replies[0].json()["outputs"][0]["data"] == [0]


async def test_shutdown_cancels_what_outlives_the_grace_period(
    make_settings: Callable[..., Settings],
) -> None:
    replies: list[httpx.Response] = []
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            server: Server = await nursery.start(serve, make_settings(grace_period=0.2))
            gate = gate_of(server)

            async def stuck() -> None:
                async with httpx.AsyncClient(base_url=str(server.http_url)) as client:
                    replies.append(
                        await client.post("/v2/models/gate/infer", json=gate_body("stuck", "never"))
                    )

            nursery.start_soon(stuck)
            await gate.started["stuck"].wait()
            server.shutdown()
            await gate.left["stuck"].wait()
    assert gate.outcome["stuck"] == "cancelled"
    # an answer, not a cut connection (issue 14)
    assert [(r.status_code, r.json()) for r in replies] == [(503, {"error": "the server is shutting down"})]


async def test_cancelling_the_surrounding_scope_stops_everything(
    make_settings: Callable[..., Settings],
) -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            server: Server = await nursery.start(serve, make_settings())
            address = server.http_address
            assert address is not None
            engine = server.engine
            nursery.cancel_scope.cancel()
    assert await engine.models() == []
    with pytest.raises(OSError):
        await trio.open_tcp_stream(*address)


async def test_serve_on_listeners_bound_beforehand(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    listeners = open_listeners(attrs.evolve(settings, grpc_port=0))
    assert listeners.http is not None and listeners.grpc is not None
    assert type(listeners.http) is socket.socket and type(listeners.grpc) is socket.socket
    http_port, grpc_port = listeners.http.getsockname()[1], listeners.grpc.getsockname()[1]
    assert http_port > 0 and grpc_port > 0
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            server: Server = await nursery.start(partial(serve, settings, listeners=listeners))
            assert server.http_address == ("127.0.0.1", http_port)
            assert server.grpc_address == ("127.0.0.1", grpc_port)  # the listener wins over grpc_port=None
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"http://127.0.0.1:{http_port}/v2/health/live")).status_code == 200
            nursery.cancel_scope.cancel()
    assert listeners.http.fileno() == -1 and listeners.grpc.fileno() == -1  # serve() closed them


def test_open_listeners_names_the_port_in_use_and_leaves_nothing_open() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        open_files = len(os.listdir("/proc/self/fd"))
        with pytest.raises(ListenError) as info:
            open_listeners(Settings(http_port=0, grpc_port=port))
        assert len(os.listdir("/proc/self/fd")) == open_files  # the REST socket was closed
        assert str(info.value) == f"cannot listen on 127.0.0.1:{port} (gRPC): address already in use"
        assert isinstance(info.value, OSError) and info.value.errno == errno.EADDRINUSE
    assert open_listeners(Settings(http_port=None, grpc_port=None)) == Listeners(None, None)


# -- the command line --------------------------------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORSERVE_")}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actorserve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or cli_env(),
        cwd=ROOT,
    )


@asynccontextmanager
async def cli_server(
    *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[trio.Process, str, list[str]]]:
    """Run the CLI; yield (process, REST URL from its log, the log lines so far)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "actorserve", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env or cli_env(),
        cwd=ROOT,
    )
    assert process.stderr is not None
    log = b""
    try:
        with trio.fail_after(60):
            while (match := re.search(rb"REST listening on (http://\S+)", log)) is None:
                chunk = await process.stderr.receive_some()
                if not chunk:
                    raise AssertionError(f"the server exited:\n{log.decode()}")
                log += chunk
        yield process, match[1].decode(), log.decode().splitlines()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_cli_serves_builtins_and_stops_on_sigint() -> None:
    async with cli_server("--http-port", "0", "--grpc-port", "off", "--workers", "2") as (
        process,
        url,
        lines,
    ):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":0")
        for name, cls in (
            ("identity", "IdentityModel"),
            ("streamer", "StreamerModel"),
            ("accumulator", "AccumulatorModel"),
        ):
            assert any(f"loaded model {name} version 1 ({cls}, workers=2" in line for line in lines), lines
        async with httpx.AsyncClient(base_url=url) as client:
            body = {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1], "data": [1]}]}
            assert (await client.post("/v2/models/identity/infer", json=body)).status_code == 200
        process.send_signal(signal.SIGINT)
        with trio.fail_after(TIMEOUT):
            assert await process.wait() == 0


async def test_cli_environment_variables_and_sigterm() -> None:
    env = cli_env(
        ACTORSERVE_HTTP_PORT="0",
        ACTORSERVE_GRPC_PORT="off",
        ACTORSERVE_MAX_BODY_BYTES="100",
        ACTORSERVE_LOG_LEVEL="info",
    )
    async with cli_server(env=env) as (process, url, _):
        async with httpx.AsyncClient(base_url=url) as client:
            reply = await client.post("/v2/models/identity/infer", content=b"x" * 101)
            assert (reply.status_code, reply.json()) == (
                413,
                {"error": "the request body is larger than 100 bytes (max_body_bytes)"},
            )
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(TIMEOUT):
            assert await process.wait() == 0


def test_cli_help_explains_every_flag() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for word in (
        "MODELS_DIR",
        "--host",
        "--http-port",
        "--grpc-port",
        "--workers",
        "--max-body-bytes",
        "--grace-period",
        "--log-level",
        "--grpc-stream-dialect",
        "ACTORSERVE_HTTP_PORT",
        "ACTORSERVE_MODEL_FOLDERS",
        "SIGTERM",
    ):
        assert word in result.stdout


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-settings.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "invalid JSON: "),
        (json.dumps({"name": "m", "implementation": "x.Y", "colour": 1}), "unknown setting(s) colour"),
        (json.dumps({"name": "m"}), "missing 'implementation'"),
        (
            json.dumps({"name": "m", "implementation": "no_such_module.Model"}),
            "model 'm': cannot import 'no_such_module.Model': No module named 'no_such_module'",
        ),
    ],
)
def test_cli_bad_model_folder_is_one_line_and_exit_2(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path / "m", text)
    result = run_cli(str(tmp_path), "--http-port", "0", "--grpc-port", "off")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("actorserve: error: ")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"actorserve: error: {path}: ")
    assert problem in errors[0]
    assert "Traceback" not in result.stderr


def test_cli_bad_arguments_exit_2() -> None:
    assert run_cli("--http-port", "http").returncode == 2
    assert run_cli("--workers", "0").returncode == 2
    assert run_cli("--grpc-stream-dialect", "kserve").returncode == 2
    result = run_cli("/no/such/folder", "--http-port", "0")
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "actorserve: error: /no/such/folder: not a folder",
    )
    bad_env = run_cli(env=cli_env(ACTORSERVE_HTTP_PORT="eighty"))
    assert bad_env.returncode == 2
    assert (
        "Error: Invalid value for ACTORSERVE_HTTP_PORT: 'eighty' is not a port number or 'off'"
        in bad_env.stderr
    )


def test_cli_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--http-port", str(port), "--grpc-port", "off")
    assert result.returncode == 1
    assert (
        f"actorserve: error: cannot listen on 127.0.0.1:{port} (REST): address already in use"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
