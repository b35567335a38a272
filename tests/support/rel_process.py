"""What the process-fault tests read from /proc: a process's TCP connections and
listening sockets (Linux), and a stream reader that records how a stream ended."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import httpx


def socket_inodes(pid: int) -> set[str]:
    """The inodes of every socket process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _tcp_rows() -> list[list[str]]:
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        rows += [line.split() for line in Path(table).read_text().splitlines()[1:]]
    return rows


def established_connections(pid: int, port: int) -> int:
    """Established TCP connections to local ``port`` that process ``pid`` holds."""
    inodes = socket_inodes(pid)
    return sum(
        1
        for fields in _tcp_rows()
        if int(fields[1].rsplit(":", 1)[1], 16) == port
        and fields[3] == "01"
        and fields[9] in inodes  # 01: ESTABLISHED
    )


def listening_inode(port: int) -> str:
    """The inode of the one socket listening on local ``port``."""
    (inode,) = {
        f[9] for f in _tcp_rows() if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A"
    }  # 0A: LISTEN
    return inode


def stream_tokens(url: str, n_tokens: int, delay: float, box: dict[str, Any]) -> None:
    """POST generate_stream on ``streamer`` on a new connection; ``box["lines"]`` gets
    the non-empty lines, ``box["error"]`` the exception that ended it, if any."""
    lines: list[str] = box.setdefault("lines", [])
    body = {"text_input": "x", "parameters": {"n_tokens": n_tokens, "delay": delay}}
    try:
        with (
            httpx.Client(base_url=url, timeout=30) as client,
            client.stream("POST", "/v2/models/streamer/generate_stream", json=body) as response,
        ):
            lines += [line for line in response.iter_lines() if line]
    except httpx.HTTPError as exc:
        box["error"] = exc


def start_streams(
    url: str, count: int, n_tokens: int, delay: float, *, daemon: bool = False
) -> tuple[list[dict[str, Any]], list[threading.Thread]]:
    """``count`` :func:`stream_tokens` calls, each on its own thread (started): their boxes
    and threads."""
    boxes: list[dict[str, Any]] = [{} for _ in range(count)]
    threads = [
        threading.Thread(target=stream_tokens, args=(url, n_tokens, delay, box), daemon=daemon)
        for box in boxes
    ]
    for thread in threads:
        thread.start()
    return boxes, threads
