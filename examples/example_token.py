"""The server's bearer token for the examples, and their one way of saying it is missing.

Not an example of its own: each example imports it (``python examples/NAME.py`` puts this
folder on ``sys.path``). The token comes from ``ACTORSERVE_TOKEN`` (the file the server's
log names, see docs/security.md); a request the server refuses for want of it stops the
example with :data:`example_token.REFUSED`, one line, no stack trace.
"""

from __future__ import annotations

import os
import sys

import httpx

#: what a refused request (401 / 403, gRPC UNAUTHENTICATED) stops the example with
REFUSED = (
    "the server refused {}: it needs its bearer token. Run with "
    "ACTORSERVE_TOKEN=$(cat <the token file named in the server's log>) (see docs/security.md)"
)
TOKEN = os.environ.get("ACTORSERVE_TOKEN", "")
#: HTTP headers (httpx, tritonclient.http)
AUTH = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
#: gRPC metadata (grpclib, tritonclient.grpc): lower-case keys
METADATA = {"authorization": f"Bearer {TOKEN}"} if TOKEN else {}


def refused(what: str) -> None:
    """Stop the example: the server refused ``what`` for want of the token."""
    sys.exit(REFUSED.format(what))


def refused_hook(response: httpx.Response) -> None:
    """httpx response hook: stop the example on 401 / 403."""
    if response.status_code in (401, 403):
        request = response.request
        refused(f"{request.method} {request.url.path} (HTTP {response.status_code})")


#: ``event_hooks`` for an httpx client
HOOKS = {"response": [refused_hook]}
