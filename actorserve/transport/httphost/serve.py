"""``serve_http``: hypercorn's trio worker on a listening socket the caller bound, for
one REST port's application (an :class:`~.host.HttpHost` inside its :class:`~.drain.Drain`)."""

from __future__ import annotations

import logging
import socket
from functools import partial

import trio
from hypercorn.config import Sockets as HypercornSockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from ...replica import REPLICA_HEADER, replica_id
from ...settings import Settings
from .protocols import ServerConfig, install, use_parser
from .replies import ASGIApp

#: seconds after the grace period for the requests it ended to send their last chunk
#: and for the engine to stop (the transports ended every request by then)
END_MARGIN = 1.0


async def serve_http(
    app: ASGIApp,
    sock: socket.socket,
    settings: Settings,
    done: trio.Event,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn's trio worker on the listening socket ``sock``, serving ``app`` (which
    refuses new requests while draining). ``done`` (no request left) stops accepting and
    closes the connections, after at most :data:`END_MARGIN` s for their last writes;
    ``stopped`` is set when it is done."""
    config = ServerConfig()
    config.fixed_headers = ((REPLICA_HEADER.encode(), replica_id(settings.replica_id).encode()),)
    config.graceful_timeout = END_MARGIN
    config.keep_alive_timeout = settings.keep_alive_timeout
    config.backlog = settings.backlog  # unused on our own sockets (listeners.py listens), kept in step
    config.accesslog = None  # no per-request logging on the hot path
    config.errorlog = logging.getLogger("hypercorn.error")
    install()
    use_parser(config, settings.http_parser)
    try:
        async with trio.open_nursery() as nursery:
            # hypercorn.trio.serve() without its own binding: worker_serve takes our socket
            serve_app = partial(
                worker_serve,
                wrap_app(app, config.wsgi_max_body_size, None),
                config,
                sockets=HypercornSockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[]),
                shutdown_trigger=done.wait,
            )
            await nursery.start(serve_app)
            host, port = sock.getsockname()[:2]
            task_status.started((str(host), int(port)))
    finally:
        stopped.set()


__all__ = ["END_MARGIN", "serve_http"]
