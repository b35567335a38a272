"""The engine in a child process (``python -m actorserve.server.engine_main``) serving a
client in this one; SIGTERM shuts it down cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio
from link_support import prompt, socket_path

from actorserve.ipc import open_engine_client
from actorserve.server.engine_main import READY_LINE

ROOT = Path(__file__).resolve().parents[2]


async def test_engine_process_serves_and_stops_on_sigterm() -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    with socket_path() as path:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "actorserve.server.engine_main", path], stdout=subprocess.PIPE, env=env
        )
        try:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(60):
                while b"\n" not in seen:
                    seen += await process.stdout.receive_some()
            assert seen.decode().strip() == f"{READY_LINE} {path}"
            async with open_engine_client(path) as client:
                async with client.infer_stream(prompt("p", n_tokens=3), model="streamer") as responses:
                    texts = [r.outputs[0].data[0] async for r in responses]
                assert texts == [b"p:0", b"p:1", b"p:2"]
                process.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    await client.wait_closed()
            with trio.fail_after(30):
                assert await process.wait() == 0
            assert not await trio.Path(path).exists()
        finally:
            process.kill()
