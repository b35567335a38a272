"""Where a server listens, as its log lines and errors name it: the ports, the listen
backlog, and addresses formatted for people.

On the ground floor (no sub-package imported), so the server's listeners and the gRPC host
share one spelling of every address and one default backlog."""

from __future__ import annotations

import logging
from typing import Final

log = logging.getLogger("actorserve.server.processes")

#: Listeners field -> (the Settings field of its port, its name in errors and the log)
PORTS: Final = {
    "http": ("http_port", "REST"),
    "grpc": ("grpc_port", "gRPC"),
    "ts_inference_grpc": ("ts_inference_grpc_port", "TorchServe inference gRPC"),
    "ts_management_grpc": ("ts_management_grpc_port", "TorchServe management gRPC"),
    "ts_management_http": ("ts_management_http_port", "TorchServe management REST"),
}


#: pending connections each listening socket queues before the server accepts them, by
#: default (``Settings.backlog``). hypercorn's own default is 100 and grpclib's 100: a
#: surge of clients then overflows the queue, and the kernel drops their handshakes
#: (they retry after 1 s, 3 s, ...) or, with ``tcp_abort_on_overflow``, resets them.
BACKLOG = 2048


def host_port(host: str, port: int) -> str:
    """``host:port`` (IPv6 hosts in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 hosts in brackets)."""
    return f"http://{host_port(host, port)}"


def browsable(url: str) -> str:
    """``url`` with a wildcard host (every interface) replaced by loopback, for a browser."""
    return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")


def log_extra_address(
    name: str, host: str, port: int, logger: logging.Logger = log, level: int = logging.INFO
) -> None:
    """The log line of an extra TorchServe port (``name`` a field of :class:`Listeners`)."""
    where = http_url(host, port) if name.endswith("_http") else host_port(host, port)
    logger.log(level, "%s listening on %s", PORTS[name][1], where)
