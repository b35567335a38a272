"""The one reading of a REST request's target: what auth and every door's routing see.

A request is served only if its target is origin-form with exactly one leading ``/``
(RFC 9112 3.2.1), so that the string the guard classifies is the string that routes:

- ``scope["raw_path"]`` (the bytes on the wire, before percent-decoding; hypercorn keeps
  the query apart) must start with ``/`` and not ``//``: an absolute-form target
  (``http://host/...``), an authority or asterisk form, and an HTTP/2 ``:path`` without
  its leading ``/`` are refused, as are targets with a percent-encoded ``/`` or ``\\``
  (``%2F``, ``%5C``), whose segments a proxy and this server would split differently;
- ``scope["path"]`` (percent-decoded, what every door routes on) must start with one
  ``/``, hold no ``//`` and no ``.`` or ``..`` segment (also as ``%2e%2e``), and no
  control or other non-printable character (``%0a``, ``%00``, ...).

Quart turns an absolute-form target into its path and Werkzeug merges or strips
slashes before matching; a prefix test on ``scope["path"]`` saw neither, so
``//v2/repository/models/m/unload`` once reached the management views without a token.
No I/O here: :func:`refusal` is a plain function of the scope.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

#: a percent-encoded ``/`` or ``\\`` in the raw target
_ENCODED_SEPARATOR: Final = re.compile(rb"%(?:2f|5c)", re.IGNORECASE)


def refusal(scope: Mapping[str, Any]) -> str | None:
    """Why this HTTP scope's target is refused (a message for the 400), or None if its
    ``path`` is canonical and may be routed and authorised as it is."""
    path = scope.get("path")
    raw = scope.get("raw_path")
    if not isinstance(path, str) or not path:
        return "the request target is empty"
    if isinstance(raw, bytes | bytearray):
        if not raw.startswith(b"/") or raw.startswith(b"//"):
            return "the request target must be a path with a single leading '/' (origin-form)"
        if _ENCODED_SEPARATOR.search(raw):
            return "the request path must not hold a percent-encoded '/' or '\\'"
    if not path.startswith("/") or "//" in path:
        return "the request path must start with a single '/' and hold no empty segment ('//')"
    if not path.isprintable():
        return "the request path must not hold control or non-printable characters"
    for segment in path.split("/"):
        if segment in (".", ".."):
            return "the request path must not hold '.' or '..' segments"
    return None


__all__ = ["refusal"]
