"""The OIP's REST door: Open Inference Protocol (KServe V2) over HTTP, served by the
HTTP host (:mod:`actorserve.transport.httphost`).

Layers, each its own module:

- :mod:`.wire` — request headers, OIP bodies (JSON, Triton's binary tensors), infer
  responses, JSON error replies, gzip; no I/O;
- :mod:`.generate` — Triton's generate extension (JSON bodies, query strings); no I/O;
- :mod:`.sse` — server-sent event framing and the coalescing event writer;
- :mod:`.asgi` — the raw-ASGI paths: ``infer``, ``generate`` and every stream;
- :mod:`.views` — the Quart views of the other endpoints;
- :mod:`.app` — :class:`OipRest`, the door: the raw paths first, Quart for the rest.

HTTP/1.1 and HTTP/2 under hypercorn are the HTTP host's
(:mod:`actorserve.transport.httphost.protocols`, ``.http1``). Everything is typed
against :class:`actorserve.api.EngineAPI`; nothing here knows the actors.
"""

from .app import OipRest, create_door

__all__ = ["OipRest", "create_door"]
