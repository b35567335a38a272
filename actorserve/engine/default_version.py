"""Which version of a model answers a request that names none.

Two rules, by where the model comes from:

- an actorserve model (OIP's rule): the version set with ``set_default_version``, else
  the newest (highest) loaded version, so loading version 2 moves unversioned requests
  to it;
- a TorchServe model (loaded from a ``.mar`` or archive folder): the first version
  registered stays the default until ``SetDefault`` / ``PUT /models/{m}/{v}/set-default``
  (TorchServe's ``ModelVersionedRefs``), so registering 2.0 next to a served 1.0 moves
  nothing until the operator says so.

Both rules answer every door alike: the OIP and TorchServe APIs of one model agree on
its default. Owned by the engine (trio thread only).
"""

from __future__ import annotations

from collections.abc import Collection

from ..settings import ModelSettings
from ..torchserve_envelope import PLATFORM, SEQUENCE_PLATFORM
from .catalog import version_key


def first_stays_default(settings: ModelSettings) -> bool:
    """Whether ``settings``' model follows TorchServe's rule (it is a TorchServe model)."""
    return settings.platform in (PLATFORM, SEQUENCE_PLATFORM)


class DefaultVersions:
    """The default version of each model name: chosen ones, else the newest loaded."""

    def __init__(self) -> None:
        self._chosen: dict[str, str] = {}

    def of(self, name: str, loaded: Collection[str]) -> str:
        """The default among ``loaded`` (not empty): the chosen version while it is
        loaded, else the newest."""
        chosen = self._chosen.get(name)
        if chosen is not None and chosen in loaded:
            return chosen
        return max(loaded, key=version_key)

    def choose(self, name: str, version: str) -> None:
        """``version`` answers ``name``'s unversioned requests from now on."""
        self._chosen[name] = version

    def loaded(self, settings: ModelSettings, before: str | None) -> None:
        """``settings``' version is now served; ``before``: the default just before it
        loaded (None: no version was loaded). A TorchServe model keeps that one (or,
        for its first version, this one); an actorserve model's newest takes over."""
        if first_stays_default(settings) and settings.name not in self._chosen:
            self._chosen[settings.name] = before or settings.version

    def unloaded(self, name: str, version: str, remaining: Collection[str]) -> None:
        """``version`` of ``name`` is no longer served; ``remaining``: the versions that
        are. An unloaded default is forgotten (the newest remaining one answers)."""
        if not remaining or self._chosen.get(name) == version:
            self._chosen.pop(name, None)
