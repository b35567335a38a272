"""TorchServe compatibility: its handlers and ``.mar`` archives on our engine.

:mod:`.archive` reads archives and model folders into settings, :mod:`.handler_model`
runs their handlers as a :class:`~actorserve.model.BatchModel`, :mod:`.context` is the
``context`` they get, and :mod:`.envelope` is how requests and responses travel between
the TorchServe transports (``actorserve.transport.torchserve``) and the handler model.
"""

from .archive import Overrides, archive_settings, find_archives, is_archive
from .context import send_intermediate_predict_response

__all__ = [
    "Overrides",
    "archive_settings",
    "find_archives",
    "is_archive",
    "send_intermediate_predict_response",
]
