"""How many OpenMP threads the ``vllm`` runtime's steps run with (``parameters.threads``).

torch's default is one thread per CPU. In the engine process that team shares the CPUs
with the event loop, the front and the step's own Python, and every barrier of a decode
step's hundreds of small ops waits for a CPU: at one stream a token cost 29 ms of CPU on
the 2-core benchmark machine instead of 7 with one thread (docs/llm.md). vLLM's own server
gives its CPU worker the CPUs less one (it keeps one for its scheduler and API process),
and its GPU worker one thread; 0 follows that rule.
"""

from __future__ import annotations

import os


def step_threads() -> int:
    """vLLM's rule for its CPU worker (``vllm serve``): the CPUs this process may run
    on, less one kept for the scheduler and the API (at least one)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus - 1)


def set_step_threads(threads: int) -> int:
    """On the step thread, before its first step: give it ``threads`` OpenMP threads
    (0: :func:`step_threads` on a CPU, vLLM's own setting on a GPU). torch's count is
    per thread that starts parallel work, so this runs on the thread that steps. Returns
    the count it runs with."""
    import torch
    from vllm.platforms import current_platform

    if not threads and current_platform.is_cpu():
        threads = step_threads()
    if threads:
        # vLLM's CPU worker made torch.set_num_threads a no-op; torch._C's is the real one
        torch._C.set_num_threads(threads)
    return int(torch.get_num_threads())
