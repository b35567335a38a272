"""The engine side: the in-process :class:`Engine` and what only it uses.

Its modules hold the model repository (folders, ``model-settings.json``), load-time
validation and overrides, the catalog of loaded versions, repository polling, default
versions, the gauges fed from the engine, and scale-in. The transports never import this
package: they know the engine only as :class:`actorserve.api.EngineAPI`, which a front
process reaches over the engine link (``actorserve.ipc``)."""

from .core import Engine, open_engine

__all__ = ["Engine", "open_engine"]
