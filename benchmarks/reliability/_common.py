"""Pieces the overload / disconnects / memory scenarios share: the server in a subprocess,
``/metrics`` reads, and the load library of the tests (``tests/support/rel_load.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from support import rel_load as load  # re-exported: the scenarios use it
from support.scrape import parse
from support.servers import ServerProcess, start_server

LIVE = (
    "actorserve_requests_in_flight",
    "actorserve_model_requests_in_flight",
    "actorserve_batch_waiting",
    "actorserve_batch_running",
)


class Running:
    """``python -m actorserve`` (``--api-workers N``) with REST and gRPC on free ports."""

    def __init__(self, api_workers: int, *args: str) -> None:
        self.server: ServerProcess = start_server(
            "--http-port", "0", "--grpc-port", "0", "--api-workers", str(api_workers), *args
        )
        self.api_workers = api_workers

    def __enter__(self) -> Running:
        try:
            prefix = "processes: " if self.api_workers else ""
            host, port = self.server.wait_for(prefix + r"REST listening on http://(\S+):(\d+)", 180).groups()
            grpc = self.server.wait_for(prefix + r"gRPC listening on (\S+)", 30)[1].rsplit(":", 1)
        except BaseException:
            self.server.stop()
            raise
        self.http = (host, int(port))
        self.grpc = (grpc[0], int(grpc[1]))
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    @property
    def pid(self) -> int:
        return self.server.process.pid

    @property
    def url(self) -> str:
        return f"http://{self.http[0]}:{self.http[1]}"


async def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return parse((await client.get("/metrics")).text)


def live_work(samples: dict[Any, float]) -> dict[str, float]:
    return {f"{n}{dict(labels)}": v for (n, labels), v in samples.items() if n in LIVE and v}


def tasks(samples: dict[Any, float]) -> float:
    return sum(v for (n, _), v in samples.items() if n == "actorserve_tasks")


async def quiet(url: str, within: float = 120.0) -> dict[str, float]:
    """Wait (bounded) until nothing is in flight; what is left at the end."""
    busy: dict[str, float] = {}
    with trio.move_on_after(within):
        while True:
            busy = live_work(await scrape(url))
            if not busy:
                break
            await trio.sleep(0.5)
    return busy


def mib(value: float) -> str:
    return f"{value / 2**20:.0f}"


__all__ = ["ROOT", "Running", "live_work", "load", "mib", "quiet", "scrape", "tasks"]
