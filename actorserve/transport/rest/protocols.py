"""Which HTTP protocol hypercorn's trio TCP server builds for a connection.

:func:`install` replaces the wrapper class that server uses with :class:`ProtocolWrapper`,
which acts only for a hypercorn ``Config`` marked by :func:`use_parser` (any other
hypercorn server in the process is untouched): HTTP/1.1 on :class:`.http1.HttpToolsProtocol`
or hypercorn's h11, HTTP/2 as hypercorn chooses, and the end of every exchange shielded
(see :func:`_shielded_ends`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import hypercorn.trio.tcp_server
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, Updated
from hypercorn.protocol import ProtocolWrapper as HypercornProtocolWrapper

from .http1 import HttpToolsProtocol

_MARK: Final = "_actorserve_http1"
#: bound on the end of an exchange under a shield (closing a socket is immediate)
_CLOSE_TIMEOUT: Final = 1.0


def use_parser(config: Config, parser: str) -> None:
    """Serve HTTP/1.1 on servers started with ``config`` with ``parser``: "httptools"
    (:class:`HttpToolsProtocol`) or "h11" (hypercorn's ``H11Protocol``)."""
    setattr(config, _MARK, parser)


def install() -> None:
    """Make hypercorn's trio TCP server build its protocols with :class:`ProtocolWrapper`
    (idempotent). Servers whose config is not marked keep hypercorn's own classes."""
    hypercorn.trio.tcp_server.ProtocolWrapper = ProtocolWrapper  # type: ignore[attr-defined]


def _shielded_ends(send: Callable[[Event], Awaitable[None]]) -> Callable[[Event], Awaitable[None]]:
    """``send`` with the end of an exchange shielded from the caller's cancellation.

    A protocol closes the connection (``Connection: close``, HTTP/1.0), or arms the
    keep-alive timeout (``Updated(idle=True)``), from the task of the ASGI app that
    finished the response, and quart-trio and our raw paths cancel that task's scope as
    it finishes: hypercorn's close then dies at its first checkpoint and the socket stays
    open until the client gives up, and an idle keep-alive connection is never timed out.
    Shielded, with a bound (both are immediate)."""

    async def send_shielded_ends(event: Event) -> None:
        if isinstance(event, Closed) or (isinstance(event, Updated) and event.idle):
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                await send(event)
        else:
            await send(event)

    return send_shielded_ends


class ProtocolWrapper(HypercornProtocolWrapper):
    """hypercorn's wrapper (HTTP/2 by ALPN or prior knowledge, HTTP/1.1 otherwise), with
    HTTP/1.1 on httptools when the config asks for it, and the close shielded for both
    HTTP/1.1 protocols of a marked config."""

    def __init__(self, app: Any, config: Config, context: Any, task_group: Any, state: Any, ssl: bool,
                 client: Any, server: Any, send: Callable[[Event], Awaitable[None]],
                 alpn_protocol: str | None = None) -> None:
        parser = getattr(config, _MARK, None)
        if parser is not None:
            send = _shielded_ends(send)
        if alpn_protocol == "h2" or parser != "httptools":
            super().__init__(app, config, context, task_group, state, ssl, client, server, send, alpn_protocol)
            return
        # the attributes hypercorn's wrapper keeps (its handle() switches to HTTP/2 with them)
        self.app, self.config, self.context, self.task_group = app, config, context, task_group
        self.ssl, self.client, self.server, self.send, self.state = ssl, client, server, send, state
        self.protocol = HttpToolsProtocol(  # type: ignore[assignment]
            app, config, context, task_group, state, ssl, client, server, send
        )



__all__ = ["ProtocolWrapper", "install", "use_parser"]
