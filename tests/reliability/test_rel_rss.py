"""RSS after overload (issue 14: "RSS back within 10 % of baseline after"): a burst of
connections to one process leaves glibc's heap at its peak unless the process trims it
once idle (``actorserve/server/heaptrim.py``). The long run is ``python benchmarks/soak.py
burst`` (1,024 connections, both shapes) and the overload soak's RSS columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from support.rel_load import RssSampler, Tally, rest_call, streamer_case, tree_rss
from support.servers import ServerProcess, start_server

from actorserve.server.heaptrim import TrimPolicy, malloc_trim, trim_heap_when_idle, trim_now

#: connections opened at once
CONNECTIONS = 400
#: bytes of glibc's heap freed in the middle of live chunks, as chunks of CHUNK
CHUNKS, CHUNK = 2_000, 16 * 1024


def test_the_policy_trims_once_after_each_busy_period_and_never_under_load() -> None:
    policy = TrimPolicy(idle_cpu=0.05, min_work=0.5)
    # CPU seconds per interval: idle, busy for 3, idle for 3, a little work (below
    # min_work), idle, busy again, idle
    used = [0.0, 0.9, 0.8, 0.9, 0.01, 0.0, 0.0, 0.2, 0.0, 0.3, 0.0, 1.0, 0.02]
    trims = [i for i, u in enumerate(used) if policy.tick(u)]
    assert trims == [4, 10, 12]  # after the first busy period; once 0.2 + 0.3 add up; after the last


async def test_the_watcher_trims_in_a_thread_when_the_process_falls_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    if malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here: the watcher returns at once (tested below)")
    # the process's CPU time at each reading (one per interval, one more after a trim):
    # idle, busy 2 s, idle (trim), idle, busy 1.5 s, idle (trim), then idle for good
    readings = [0.0, 0.0, 1.0, 2.0, 2.01, 2.01, 2.01, 2.02, 3.5, 3.5, 3.5]
    calls = 0
    threads: list[int] = []

    read_all = trio.Event()

    def cpu() -> float:
        nonlocal calls
        calls += 1
        if calls == len(readings) + 5:
            read_all.set()
        return readings[min(calls, len(readings)) - 1]

    def trim() -> int:
        threads.append(threading.get_ident())
        return 0

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trim_heap_when_idle, 1.0, cpu=cpu, trim=trim))
        await read_all.wait()  # (no deadline here: the clock would jump to it while a trim runs)
        nursery.cancel_scope.cancel()
    assert len(threads) == 2
    assert threading.get_ident() not in threads  # off the event loop


async def test_without_malloc_trim_the_watcher_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import actorserve.server.heaptrim as heaptrim

    monkeypatch.setattr(heaptrim, "malloc_trim", lambda: None)
    with trio.fail_after(1):
        await heaptrim.trim_heap_when_idle()


def test_trim_now_gives_back_memory_freed_in_the_middle_of_the_heap() -> None:
    """Chunks freed below live ones stay on glibc's free lists (free() returns only the
    top of the heap): the state a burst of connections leaves. ``trim_now`` gives them back."""
    if malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here")
    trim_now()
    chunks = [bytes(CHUNK) for _ in range(CHUNKS)]  # > 512 bytes: glibc's heap, not pymalloc
    kept = chunks[::8]  # every 8th stays: nothing above the freed ones is free
    del chunks
    held = tree_rss(os.getpid())
    freed = trim_now()
    assert freed >= CHUNKS * CHUNK * 0.5, (freed, held)
    assert tree_rss(os.getpid()) <= held - CHUNKS * CHUNK * 0.5
    del kept


@pytest.fixture
def one_process(tmp_path: Path) -> Iterator[tuple[ServerProcess, tuple[str, int]]]:
    settings = {
        "name": "streamer",
        "implementation": "actorserve.models.streamer.StreamerModel",
        "max_pending": 4096,
    }
    (tmp_path / "streamer").mkdir()
    (tmp_path / "streamer" / "model-settings.json").write_text(json.dumps(settings))
    server = start_server(
        "--http-port", "0", "--grpc-port", "0", "--api-workers", "0", "--log-level", "DEBUG", str(tmp_path)
    )
    try:
        host, port = server.wait_for(r"REST listening on http://(\S+):(\d+)", 60).groups()
        yield server, (host, int(port))
    finally:
        server.stop()


async def test_a_server_trims_its_heap_once_idle_after_a_burst_of_connections(
    one_process: tuple[ServerProcess, tuple[str, int]],
) -> None:
    """Before the fix the server kept the whole peak of a burst for good (a front: 61 to
    86 MiB after 1,024 connections); now, a second after the burst, it collects and
    trims (the debug log says how much came back)."""
    if malloc_trim() is None:
        pytest.skip("no glibc malloc_trim here: nothing to give back")
    server, (host, port) = one_process
    pid = server.process.pid
    case = streamer_case(4, delay=0.05)  # 200 ms a call: the connections are open together
    assert (await rest_call(host, port, case, 0, stream=True)).kind == "ok"  # warm-up
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
    # the server looks at its CPU time every second: bounded wait for its log line
    await trio.to_thread.run_sync(server.wait_for, r"idle after load: malloc_trim gave back", 10.0)
    after = tree_rss(pid)
    assert after <= sampler.peak, (before, sampler.peak, after)


def test_a_ready_process_freezes_its_startup_objects_and_raises_the_gc_thresholds() -> None:
    """In a fresh interpreter (freezing this one would hide the test run's garbage)."""
    code = (
        "import gc; from actorserve.server.heaptrim import GC_THRESHOLDS, freeze_startup_objects; "
        "freeze_startup_objects(); print(gc.get_threshold() == GC_THRESHOLDS, gc.get_freeze_count() > 1000)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "True"]
