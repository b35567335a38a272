"""The pure parts of ``benchmarks/memory.py`` (the script itself starts servers; not here)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
from pathlib import Path
from types import ModuleType

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def memory() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmark_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_snapshot_sums_roles_into_total(memory: ModuleType) -> None:
    me = psutil.Process(os.getpid())
    sample = memory.snapshot({"engine": [me], "fronts": [me, me], "parent": []})
    assert set(sample) == {"engine", "fronts", "total"}  # a role with no process is left out
    engine = sample["engine"]
    assert 0 < engine.uss <= engine.pss <= engine.rss
    # two readings a moment apart differ by a few pages at most
    assert abs(sample["fronts"].rss - 2 * engine.rss) < 4 * MIB
    assert sample["total"] == sample["engine"] + sample["fronts"]


def test_peak_and_mean_take_each_metric_on_its_own(memory: ModuleType) -> None:
    mem = memory.Mem
    samples = [
        {"engine": mem(10, 6, 5), "total": mem(30, 20, 15)},
        {"engine": mem(12, 5, 5), "total": mem(28, 22, 16)},
        {"engine": mem(11, 7, 2), "total": mem(29, 21, 17)},
    ]
    assert memory.peak(samples) == {"engine": mem(12, 7, 5), "total": mem(30, 22, 17)}
    assert memory.mean(samples) == {"engine": mem(11, 6, 4), "total": mem(29, 21, 16)}


def test_row_prints_mib_and_dashes_for_roles_a_server_lacks(memory: ModuleType) -> None:
    sample = {"tree": memory.Mem(200 * MIB, 150 * MIB, 140 * MIB)}
    sample["total"] = sample["tree"]
    assert memory.row("MLServer", "idle", sample, "1,234") == (
        "| MLServer | idle | - | - | - | 200 / 150 / 140 | 1,234 |"
    )
    columns = memory.HEADER.splitlines()[0].count("|") - 1
    assert columns == 2 + len(memory.COLUMNS) + 1


def test_closed_loop_counts_every_token_of_concurrent_workers(memory: ModuleType) -> None:
    calls = 0

    async def one() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return 3

    tokens = asyncio.run(memory.closed_loop(one, 8, 0.05))
    assert calls >= 8
    assert tokens == 3 * calls  # no update lost across the awaits


def test_closed_loop_with_no_time_starts_nothing(memory: ModuleType) -> None:
    async def one() -> int:
        raise AssertionError("started past the deadline")

    assert asyncio.run(memory.closed_loop(one, 4, 0.0)) == 0


def test_peer_env_takes_the_profile_over_the_peer_and_fills_in_its_folder(memory: ModuleType) -> None:
    peer = {
        "env": {"PYTHONPATH": "{peer_dir}", "MLSERVER_DEBUG": "false", "OMP_NUM_THREADS": 1},
        "profiles": {"main": {"env": {"MLSERVER_PARALLEL_WORKERS": "0", "MLSERVER_DEBUG": "true"}}},
    }
    assert memory.peer_env(peer, "main", Path("/peers/mlserver")) == {
        "PYTHONPATH": "/peers/mlserver",
        "MLSERVER_DEBUG": "true",
        "OMP_NUM_THREADS": "1",
        "MLSERVER_PARALLEL_WORKERS": "0",
    }


def test_free_ports_differ_and_can_be_bound(memory: ModuleType) -> None:
    ports = memory.free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
