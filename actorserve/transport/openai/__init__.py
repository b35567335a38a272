"""The OpenAI API on the REST port: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` for every model that declares text generation
(:mod:`actorserve.textgen`), on the same engine and batches as the OIP, and vLLM's own
routes beside it (``/tokenize``, ``/detokenize``, ``/health``, ``/version``).

Layers, each its own module:

- :mod:`.parse` — request bodies checked and read; no I/O;
- :mod:`.encode` — responses, stream chunks and errors in OpenAI's shapes; no I/O;
- :mod:`.tokenize` — vLLM's tokenizer bodies and answers; no I/O;
- :mod:`.chat` — chat templates (Jinja2, sandboxed);
- :mod:`.choices` — running a request's choices on the engine;
- :mod:`.replies` — unary replies and request bodies over raw ASGI;
- :mod:`.routes` — the raw-ASGI application, mounted by the REST app under ``/v1/``.

Typed only against :class:`actorserve.api.EngineAPI`.
"""

from .routes import OpenAIRoutes

__all__ = ["OpenAIRoutes"]
