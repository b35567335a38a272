"""Issue 19, finding 1: one canonical request target for auth and routing. Every
management and inference route, attacked with the path variants that once made the
guard and the router read two different paths (``//x``, ``/./x``, ``/v2//repository``,
a trailing ``/``, absolute-form, ``%2F``, ``%2e%2e``, ``%0a``), over both HTTP/1.1
parsers on raw sockets (httpx would normalise them) and over h2c: each is refused (400)
or gets 401 without a token, never served. WebSocket handshakes are refused cleanly.
The multi-process shape is attacked in test_sec_logs.py (one subprocess per shape)."""

from __future__ import annotations

import h2.config
import h2.connection
import httpx
import pytest
import trio
from support.rel_badinput import H2Outcome, h2_exchange, launch, send_head

from actorserve.server.composition import Server
from actorserve.transport.httphost.target import refusal

TOKEN = "path-attack-token"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"
PARSERS = ["httptools", "h11"]

#: (method, path, query) of every management route of every door
MANAGEMENT = [
    ("POST", "/v2/repository/models/identity/load", ""),
    ("POST", "/v2/repository/models/identity/unload", ""),
    ("POST", "/v2/repository/models/identity/workers", ""),
    ("POST", "/v2/repository/models/identity/versions/1/workers", ""),
    ("POST", "/v2/repository/models/identity/default_version", ""),
    ("GET", "/v2/repository/models/identity", ""),
    ("GET", "/v2/repository/models/identity/versions/1", ""),
    ("GET", "/models", ""),
    ("POST", "/models", "?url=identity.mar"),
    ("GET", "/models/identity/all", ""),
    ("PUT", "/models/identity", "?min_worker=2"),
    ("PUT", "/models/identity/1/set-default", ""),
    ("DELETE", "/models/identity", ""),
]
#: every inference route family (``--auth-inference`` is on)
INFERENCE = [
    ("POST", "/v2/models/identity/infer", ""),
    ("POST", "/v2/models/identity/versions/1/infer", ""),
    ("POST", "/v2/models/streamer/infer_stream", ""),
    ("POST", "/v2/models/identity/generate", ""),
    ("GET", "/v2/models/streamer/versions/1/generate_stream", ""),
    ("POST", "/v1/completions", ""),
    ("POST", "/v1/chat/completions", ""),
    ("POST", "/predictions/identity", ""),
    ("PUT", "/predictions/identity/1", ""),
    ("POST", "/explanations/identity", ""),
]
#: ``--auth-metrics`` is on
METRICS = [("GET", "/metrics", "")]
FAMILIES = {"management": MANAGEMENT, "inference": INFERENCE, "metrics": METRICS}


def variants(path: str) -> dict[str, str]:
    """The spellings of ``path`` a lax reader might route as ``path``."""
    first, _, rest = path[1:].partition("/")
    return {
        "as is": path,
        "double leading slash": "/" + path,
        "dot segment": "/." + path,
        "dot-dot segment": "/x/.." + path,
        "inner double slash": f"/{first}//{rest}" if rest else path + "//",
        "trailing slash": path + "/",
        "absolute-form": "http://t" + path,
        "absolute-form, no path slash": "http://t" + path + "?",
        "encoded slash": f"/{first}%2F{rest}" if rest else "/%2F" + first,
        "encoded lower slash": f"/{first}%2f{rest}" if rest else "/%2f" + first,
        "encoded dot-dot": "/x/%2e%2e" + path,
        "encoded newline": path + "%0aforged",
        "encoded nul": path + "%00",
        "backslash encoded": f"/{first}%5C{rest}" if rest else "/%5C" + first,
    }


def request(method: str, target: str, auth: str = "") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: t\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n".encode()


@pytest.fixture(params=PARSERS)
async def secured(request: pytest.FixtureRequest, nursery: trio.Nursery) -> Server:
    return await launch(
        nursery, no_auth=False, token=TOKEN, auth_inference=True, auth_metrics=True, http_parser=request.param
    )


async def status_of(
    server: Server, method: str, target: str, auth: str = "", *, port: int | None = None
) -> int:
    """The status of one raw request to the REST port (or ``port``)."""
    assert server.http_address is not None
    answer = await send_head(port or server.http_address[1], request(method, target, auth))
    assert answer.closed
    return answer.status


async def still_served(server: Server) -> None:
    """Nothing the attacks sent changed the server: identity is loaded, one worker."""
    async with httpx.AsyncClient(base_url=str(server.http_url), timeout=10) as client:
        assert (await client.get("/v2/models/identity/ready")).status_code == 200
        described = await client.get(
            "/v2/repository/models/identity", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert (described.status_code, described.json()["workers"]) == (200, 1), described.json()


async def unserved_spellings(
    server: Server, routes: list[tuple[str, str, str]], port: int | None = None
) -> list[object]:
    """The spellings of ``routes`` served without the token (should be none)."""
    served: list[object] = []
    for method, path, query in routes:
        for name, target in variants(path).items():
            status = await status_of(server, method, target + query, port=port)
            if status in (400, 401):
                continue
            # a spelling no door routes may be a 404 / 405 -- but only if the token changes nothing
            with_token = await status_of(server, method, target + query, AUTH, port=port)
            if status not in (404, 405) or with_token != status:
                served.append((method, target, name, status, with_token))
    return served


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_no_spelling_of_a_protected_route_is_served_without_the_token(
    secured: Server, family: str
) -> None:
    assert await unserved_spellings(secured, FAMILIES[family]) == []
    await still_served(secured)


async def test_the_torchserve_management_port_reads_targets_alike(secured: Server) -> None:
    port = secured.extra_addresses["ts_management_http"][1]
    assert (
        await unserved_spellings(secured, [r for r in MANAGEMENT if r[1].startswith("/models")], port) == []
    )
    assert await status_of(secured, "GET", "/models", AUTH, port=port) == 200
    await still_served(secured)


async def test_the_refusal_is_a_400_that_says_why(secured: Server) -> None:
    assert secured.http_address is not None
    port = secured.http_address[1]
    answer = await send_head(port, request("POST", "//v2/repository/models/identity/unload"))
    assert answer.status == 400 and b"single leading '/'" in answer.body, answer
    answer = await send_head(port, request("POST", "http://t/v2/repository/models/identity/load"))
    assert answer.status == 400 and b"origin-form" in answer.body, answer
    answer = await send_head(port, request("GET", "/v2/health/live%0a"))
    assert answer.status == 400 and b"non-printable" in answer.body, answer
    # the canonical spellings still work, with the token where one is needed
    assert await status_of(secured, "GET", "/v2/health/live") == 200
    assert await status_of(secured, "GET", "/v2/repository/models/identity", AUTH) == 200
    await still_served(secured)


async def test_the_openai_trailing_slash_needs_the_inference_token(secured: Server) -> None:
    """The OpenAI door serves ``/v1/completions/`` as ``/v1/completions``: its auth too."""
    for path in ("/v1/completions/", "/v1/chat/completions/", "/v1/completions", "/v1/chat/completions"):
        assert await status_of(secured, "POST", path) == 401, path
        assert await status_of(secured, "POST", path, AUTH) != 401, path


def raw_h2() -> h2.connection.H2Connection:
    """A client that sends headers as given (h2 would refuse a ``:path`` without ``/``)."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding="utf-8",
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    return conn


async def h2_request(server: Server, method: str, path: str, token: bool = False) -> H2Outcome:
    assert server.http_address is not None
    conn = raw_h2()
    headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "t")]
    if token:
        headers.append(("authorization", f"Bearer {TOKEN}"))
    conn.send_headers(1, headers, end_stream=True)
    return await h2_exchange(server.http_address[1], conn)


H2_TARGETS = [
    "v2/repository/models/identity/unload",  # no leading slash: Werkzeug would add one
    "//v2/repository/models/identity/unload",
    "http://t/v2/repository/models/identity/unload",
    "/v2/repository//models/identity/unload",
    "/v2/repository/models/identity/./unload",
    "/v2%2Frepository/models/identity/unload",
    "",
]


async def test_h2c_targets_get_the_same_single_reading(secured: Server) -> None:
    for path in H2_TARGETS:
        outcome = await h2_request(secured, "POST", path)
        status = outcome.headers.get(":status")
        # refused by the server (400), or by the HTTP/2 layer (reset / GOAWAY) before the app
        assert status == "400" or (
            status is None and (outcome.reset or outcome.goaway is not None or outcome.closed)
        ), (
            path,
            outcome,
        )
    canonical = await h2_request(secured, "POST", "/v1/completions/")
    assert canonical.headers.get(":status") == "401"
    ok = await h2_request(secured, "GET", "/v2/repository/models/identity", token=True)
    assert ok.headers.get(":status") == "200"
    await still_served(secured)


async def test_httpx_h2c_prior_knowledge_is_guarded_alike(secured: Server) -> None:
    async with httpx.AsyncClient(
        base_url=str(secured.http_url), http1=False, http2=True, timeout=10
    ) as client:
        reply = await client.post("/v2/repository/models/identity/unload/")
        assert (reply.http_version, reply.status_code) == ("HTTP/2", 401)
        assert (await client.post("/v1/chat/completions/")).status_code == 401
    await still_served(secured)


WEBSOCKET = (
    "GET {path} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/repository/models/identity/unload", "/metrics"])
async def test_a_websocket_handshake_is_refused_cleanly(
    secured: Server, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """h11 hands a WebSocket scope to the app: it is closed unaccepted (hypercorn: 403),
    never given to Quart (whose error handler failed on it: 500 and a traceback).
    httptools serves an Upgrade request as plain HTTP/1.1, guarded as any other."""
    assert secured.http_address is not None
    head = WEBSOCKET.format(path=path).encode()
    # httptools answers it as a plain GET and keeps the connection: stop at the answer
    answer = await send_head(secured.http_address[1], head, wait=10, whole_answer=True)
    if secured.settings.http_parser == "h11":
        assert answer.status == 403, answer
    else:
        assert answer.status in (200, 401), answer  # plain GET: health open, management guarded
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    await still_served(secured)


@pytest.mark.parametrize(
    ("raw", "path", "refused"),
    [
        (b"/v2/models/m/infer", "/v2/models/m/infer", False),
        (b"/v2/models/m%20x/infer", "/v2/models/m x/infer", False),  # a space is printable
        (b"/models/a.b-c_1", "/models/a.b-c_1", False),
        (b"//v2/x", "//v2/x", True),
        (b"v2/x", "v2/x", True),
        (b"http://t/v2/x", "http://t/v2/x", True),
        (b"*", "*", True),
        (b"/v2/%2e%2e/x", "/v2/../x", True),
        (b"/v2/./x", "/v2/./x", True),
        (b"/v2/..", "/v2/..", True),
        (b"/a%2Fb", "/a/b", True),
        (b"/a%5cb", "/a\\b", True),
        (b"/a%0db", "/a\rb", True),
        (b"/a%7fb", "/a\x7fb", True),
        (b"", "", True),
    ],
)
def test_refusal_reads_raw_and_decoded_paths(raw: bytes, path: str, refused: bool) -> None:
    assert (refusal({"raw_path": raw, "path": path}) is not None) is refused
