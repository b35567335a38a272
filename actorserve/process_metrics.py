"""What the server's processes themselves use, read when asked: CPU time and resident
memory from ``/proc`` at scrape time (the collector :class:`actorserve.metrics.Metrics`
registers), and the trio tasks alive in this process (:func:`count_tasks`, the
``actorserve_tasks`` gauge). Apart from :mod:`actorserve.metrics`, which records what
requests and models do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class ProcessCollector(Collector):
    """CPU time and resident memory of the server's processes, read from ``/proc`` at
    scrape time (nothing to record): this process alone in the one-process shape; in
    multiprocess mode every live process that has written metrics (the engine and each
    front), found by the pid in the names of the files in ``folder``."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def _pids(self) -> set[int]:
        pids = {os.getpid()}
        if self.folder is not None:
            for path in self.folder.glob("*.db"):
                tail = path.stem.rsplit("_", 1)[-1]
                if tail.isdigit():
                    pids.add(int(tail))
        return pids

    def _read(self, pid: int) -> tuple[float, float] | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            statm = Path(f"/proc/{pid}/statm").read_text()
        except OSError:  # gone, or not Linux
            return None
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / self._ticks  # utime + stime
        rss = int(statm.split()[1]) * self._page
        return cpu, float(rss)

    def collect(self) -> Iterator[Metric]:
        readings = [r for r in (self._read(pid) for pid in sorted(self._pids())) if r is not None]
        cpu = CounterMetricFamily(
            "actorserve_process_cpu_seconds",
            "User and system CPU time of the server's processes running now.",
        )
        cpu.add_metric([], sum(r[0] for r in readings))
        memory = GaugeMetricFamily(
            "actorserve_process_resident_memory_bytes",
            "Resident memory of the server's processes running now.",
        )
        memory.add_metric([], sum(r[1] for r in readings))
        count = GaugeMetricFamily("actorserve_processes", "Processes of the server counted above.")
        count.add_metric([], len(readings))
        yield cpu
        yield memory
        yield count


def count_tasks() -> int:
    """trio tasks alive in this process's run now (the root task and every descendant);
    0 outside a trio run."""
    try:
        root = trio.lowlevel.current_root_task()
    except RuntimeError:
        return 0
    if root is None:
        return 0
    count, stack = 0, [root]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


__all__ = ["ProcessCollector", "count_tasks"]
