"""RSS after overload (issue 14: "RSS back within 10 % of baseline after"): a burst of
connections to one process leaves glibc's heap at its peak unless the process trims it
once idle (``actorserve/heaptrim.py``). The long run is ``python benchmarks/soak.py
burst`` (1,024 connections, both shapes) and the overload soak's RSS columns."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from support.rel_load import RssSampler, Tally, rest_call, streamer_case, tree_rss
from support.servers import ServerProcess, start_server

from actorserve.heaptrim import TrimPolicy, malloc_trim, trim_heap_when_idle

#: connections opened at once, and the server's RSS after the burst may stay at most this
#: far above its level before it (a fraction of that level)
CONNECTIONS, BOUND = 400, 0.05


def test_the_policy_trims_once_after_each_busy_period_and_never_under_load() -> None:
    policy = TrimPolicy(idle_cpu=0.05, min_work=0.5)
    # CPU seconds per interval: idle, busy for 3, idle for 3, a little work (below
    # min_work), idle, busy again, idle
    used = [0.0, 0.9, 0.8, 0.9, 0.01, 0.0, 0.0, 0.2, 0.0, 0.3, 0.0, 1.0, 0.02]
    trims = [i for i, u in enumerate(used) if policy.tick(u)]
    assert trims == [4, 10, 12]  # after the first busy period; once 0.2 + 0.3 add up; after the last


async def test_the_watcher_trims_in_a_thread_when_the_process_falls_idle(autojump_clock: trio.testing.MockClock) -> None:
    if malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here: the watcher returns at once (tested below)")
    # the process's CPU time at each reading (one per interval, one more after a trim):
    # idle, busy 2 s, idle (trim), idle, busy 1.5 s, idle (trim), then idle for good
    readings = [0.0, 0.0, 1.0, 2.0, 2.01, 2.01, 2.01, 2.02, 3.5, 3.5, 3.5]
    calls = 0
    threads: list[int] = []

    def cpu() -> float:
        nonlocal calls
        calls += 1
        return readings[min(calls, len(readings)) - 1]

    def trim() -> int:
        threads.append(threading.get_ident())
        return 0

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trim_heap_when_idle, 1.0, cpu=cpu, trim=trim))
        for _ in range(100):  # the clock jumps while a trim runs in its thread: count readings
            if calls >= len(readings) + 5:
                break
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert len(threads) == 2
    assert threading.get_ident() not in threads  # off the event loop


async def test_without_malloc_trim_the_watcher_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import actorserve.heaptrim as heaptrim

    monkeypatch.setattr(heaptrim, "malloc_trim", lambda: None)
    with trio.fail_after(1):
        await heaptrim.trim_heap_when_idle()


@pytest.fixture
def one_process(tmp_path: Path) -> Iterator[tuple[ServerProcess, tuple[str, int]]]:
    settings = {"name": "streamer", "implementation": "actorserve.models.streamer.StreamerModel", "max_pending": 4096}
    (tmp_path / "streamer").mkdir()
    (tmp_path / "streamer" / "model-settings.json").write_text(json.dumps(settings))
    server = start_server("--http-port", "0", "--grpc-port", "0", "--api-workers", "0", str(tmp_path))
    try:
        host, port = server.wait_for(r"REST listening on http://(\S+):(\d+)", 60).groups()
        yield server, (host, int(port))
    finally:
        server.stop()


async def test_after_a_burst_of_connections_the_rss_returns_near_its_level_before(
    one_process: tuple[ServerProcess, tuple[str, int]],
) -> None:
    """Before the fix the server kept the peak of the burst (glibc's free lists): +~X MiB
    over its ~Y MiB after 400 connections, for good."""
    if malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here: nothing to give back")
    server, (host, port) = one_process
    pid = server.process.pid
    case = streamer_case(4, delay=0.05)  # 200 ms a call: the connections are open together
    assert (await rest_call(host, port, case, 0, stream=True)).kind == "ok"  # warm-up
    await trio.sleep(1.5)
    before = tree_rss(pid)
    tally, go = Tally(), trio.Event()

    async def one(k: int) -> None:
        await go.wait()
        tally.add(await rest_call(host, port, case, k, stream=True))

    with RssSampler(pid, interval=0.05) as sampler:
        async with trio.open_nursery() as nursery:
            for k in range(CONNECTIONS):
                nursery.start_soon(one, k)
            await trio.sleep(0.1)
            go.set()
    assert tally.ok == CONNECTIONS, tally
    after = tree_rss(pid)
    with trio.move_on_after(6):  # the server's idle check runs every second
        while after > before * (1 + BOUND):
            await trio.sleep(0.25)
            after = tree_rss(pid)
    mib = 2**20
    assert after <= before * (1 + BOUND), (
        f"RSS {before / mib:.1f} MiB before, {sampler.peak / mib:.1f} at the peak, {after / mib:.1f} after idle"
    )
