"""The repository index beyond the loaded versions: model versions that failed to load
or were unloaded stay listed as ``UNAVAILABLE`` with their reason (as in Triton), and so
do models in the model folders that were never loaded, and broken model folders."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from ..api import ModelState, RepositoryEntry
from ..settings import ModelSettings

#: the reason of a model in the folders that nobody asked to load
NOT_LOADED = "not loaded"
#: the reason of a model version unloaded on request
UNLOADED = "unloaded"


def version_key(version: str) -> tuple[int, int | str]:
    """Versions in order: numbers by value, then names."""
    return (0, int(version)) if version.isdigit() else (1, version)


class Catalog:
    """Why each known model version is not being served. Owned by the engine (trio
    thread only). A broken model folder is known by its folder's name and version ""."""

    def __init__(self) -> None:
        self._unavailable: dict[tuple[str, str], str] = {}

    def failed(self, name: str, version: str, reason: str) -> None:
        """``name`` ``version`` could not be loaded (or was unloaded) because ``reason``."""
        self._unavailable[(name, version)] = reason

    def served(self, name: str, version: str) -> None:
        """``name`` ``version`` loaded: forget why it was unavailable (and any problem of
        its folder, which was fixed)."""
        self._unavailable.pop((name, version), None)
        self._unavailable.pop((name, ""), None)

    def reason(self, name: str, version: str) -> str:
        return self._unavailable.get((name, version), "")

    def index(
        self,
        loaded: Iterable[RepositoryEntry],
        scanned: tuple[list[ModelSettings], dict[str, str]] | None = None,
    ) -> list[RepositoryEntry]:
        """The ``loaded`` versions, then every other known one as UNAVAILABLE, sorted
        by name and version; ``scanned`` is :meth:`ModelRepository.scan` (the models in
        the folders, and the broken folders' problems)."""
        rows = {(entry.name, entry.version): entry for entry in loaded}
        names = {name for name, _ in rows}
        for (name, version), reason in self._unavailable.items():
            if (name, version) not in rows and not (version == "" and name in names):
                rows[(name, version)] = RepositoryEntry(name, version, ModelState.UNAVAILABLE, reason)
        models, problems = scanned or ([], {})
        for model in models:
            rows.setdefault(
                (model.name, model.version),
                RepositoryEntry(model.name, model.version, ModelState.UNAVAILABLE, NOT_LOADED),
            )
        for folder, problem in problems.items():
            if folder not in names:
                rows.setdefault((folder, ""), RepositoryEntry(folder, "", ModelState.UNAVAILABLE, problem))
        return [rows[key] for key in sorted(rows, key=lambda k: (k[0], version_key(k[1])))]


class Watchers:
    """Who to tell, synchronously, when what ``model_info`` / ``metadata`` answer may
    change (a version loading, loaded, failed, stopped or unloaded, the default version,
    workers): the engine link pushes it to every front, which forgets what it cached.
    Told before the engine next yields to the scheduler, so no answer computed after the
    change can reach a front ahead of the push."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []

    @contextmanager
    def watching(self, callback: Callable[[], None]) -> Iterator[None]:
        self._callbacks.append(callback)
        try:
            yield
        finally:
            self._callbacks.remove(callback)

    def changed(self) -> None:
        for callback in tuple(self._callbacks):
            callback()
