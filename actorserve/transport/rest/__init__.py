"""The REST transport: Open Inference Protocol (KServe V2) over HTTP, on hypercorn.

Layers, each its own module:

- :mod:`.wire` — request headers, OIP bodies (JSON, Triton's binary tensors), infer
  responses, JSON error replies, gzip; no I/O;
- :mod:`.generate` — Triton's generate extension (JSON bodies, query strings); no I/O;
- :mod:`.sse` — server-sent event framing and the coalescing event writer;
- :mod:`.asgi` — the raw-ASGI paths: ``infer``, ``generate`` and every stream;
- :mod:`.views` — the Quart views of the other endpoints;
- :mod:`.app` — :func:`create_app`: the raw paths first, Quart for the rest.

Everything is typed against :class:`actorserve.api.EngineAPI`; nothing here knows the
actors.
"""

from .app import RestApp, create_app

__all__ = ["RestApp", "create_app"]
