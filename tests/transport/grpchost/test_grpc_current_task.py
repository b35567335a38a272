"""grpclib finds its handler's asyncio task through the ``current_task`` trio_asyncio
installs, whatever was imported first (on Python 3.12+ the C function grpclib would
otherwise keep cannot see trio_asyncio's loop, and every gRPC handler fails)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import asyncio, grpclib.utils          # grpclib first, as a client or the stubs would
import actorserve.transport.grpchost.server
assert grpclib.utils._current_task is asyncio.current_task, grpclib.utils._current_task
print("ok")
"""


def test_grpclib_uses_trio_asyncios_current_task_even_when_imported_first() -> None:
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
