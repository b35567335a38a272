"""TorchServe compatibility: its handlers and ``.mar`` archives on our engine.

:mod:`.archive` reads archives and model folders into settings, :mod:`.handler_model`
runs their handlers as a :class:`~actorserve.model.BatchModel`, :mod:`.context` is the
``context`` they get. How requests and responses travel between TorchServe's door
(``actorserve.transport.torchserve``) and the handler model is part of the engine API,
:mod:`actorserve.torchserve_envelope`: the door and this package meet only there.
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
