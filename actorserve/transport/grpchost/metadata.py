"""Initial metadata beyond grpclib's: what every response's headers carry (the
replica's name, a sequence's id), reaching into grpclib's HTTP/2 stream as :mod:`.h2`
does (grpclib 0.4.9)."""

from __future__ import annotations

from typing import Any

from grpclib.server import Stream


def with_initial_metadata(stream: Any, fixed: tuple[tuple[str, str], ...]) -> None:
    """Make the HTTP/2 ``stream``'s response headers (the first ``send_headers``, the
    one with ``:status``; trailers-only on an error) carry ``fixed`` and whatever
    :func:`add_initial_metadata` added by then. Below grpclib, so that every path that
    answers (grpclib's, :class:`.wire.Wire`'s own headers, an error) carries them."""
    stream.initial_metadata = list(fixed)
    send_headers = stream.send_headers

    async def send_headers_with_metadata(headers: Any, end_stream: bool = False) -> None:
        if headers and headers[0][0] == ":status":
            headers = [*headers, *stream.initial_metadata]
        await send_headers(headers, end_stream=end_stream)

    stream.send_headers = send_headers_with_metadata


def add_initial_metadata(stream: Stream[Any, Any], key: str, value: str) -> None:
    """Send ``key: value`` in the call's initial metadata (or trailers-only) if they
    have not gone out yet; later, or on a server without fixed metadata, nothing."""
    extra = getattr(stream._stream, "initial_metadata", None)
    if extra is not None and not stream._send_initial_metadata_done:
        extra.append((key, value))


__all__ = ["add_initial_metadata", "with_initial_metadata"]
