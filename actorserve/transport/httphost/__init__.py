"""The HTTP host: what every REST request of every door shares.

- :mod:`.host` — :class:`HttpHost`: the ASGI application of a REST port (target check,
  CORS, the token check, the request's record for metrics and the access log,
  ``/metrics``), handing each request to the door that claims its path;
- :mod:`.door` — :class:`HttpDoor`: what a door declares (its paths, their auth scope,
  its refusal and end-of-stream bodies) and how it is handed a request;
- :mod:`.drain` — :class:`Drain`: the shutdown of a REST port (503, ends of streams);
- :mod:`.serve` — :func:`serve_http`: hypercorn on a listening socket;
- :mod:`.cors`, :mod:`.target`, :mod:`.replies` — CORS, the one reading of a request
  target, the host's own replies.

The doors (:mod:`actorserve.transport.rest`, ``.openai``, ``.torchserve``,
``.playground``) are listed by :mod:`actorserve.server.doors`.
- :mod:`.protocols`, :mod:`.http1`, :mod:`.writes` — HTTP/1.1 (httptools or h11) and
  HTTP/2 under hypercorn, and the direct non-blocking socket writes every connection uses.
"""

from .door import HttpDoor
from .drain import Drain
from .host import HttpHost

__all__ = ["Drain", "HttpDoor", "HttpHost"]
