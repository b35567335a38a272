"""The model repository: where model versions come from, and how their code is loaded.

``ModelRepository`` knows the model folders given on the command line (re-read on every
load request, so a model added or changed on disk can be loaded) and the models given in
code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from .errors import BadInput, ModelNotFound
from .settings import (
    MODEL_SETTINGS_FILE,
    ModelSettings,
    SettingsError,
    discover_models,
    load_model_settings,
)


@attrs.frozen
class ModelRepository:
    """Where models come from: the model folders given on the command line (re-read on
    every ``load`` request, so a model added or changed on disk can be loaded) and the
    models given in code. ``workers`` overrides every model's ``workers``."""

    folders: tuple[Path, ...] = ()
    workers: int | None = None

    def discover(self) -> list[ModelSettings]:
        """Every model in the folders; :class:`SettingsError` names a bad file."""
        models: list[ModelSettings] = []
        for folder in self.folders:
            models.extend(discover_models(folder))
        return self.apply_overrides(models)

    def apply_overrides(self, models: Iterable[ModelSettings]) -> list[ModelSettings]:
        if self.workers is None:
            return list(models)
        return [attrs.evolve(m, workers=self.workers) for m in models]

    def find(self, name: str, known: Sequence[ModelSettings] = ()) -> list[ModelSettings]:
        """Every version of model ``name``: from the folders, else from ``known``.

        Raises :class:`ModelNotFound`, or :class:`BadInput` when the model's own
        settings file is invalid (other broken files are skipped)."""
        found: list[ModelSettings] = []
        problem: SettingsError | None = None
        for folder in self.folders:
            for path in sorted(Path(folder).rglob(MODEL_SETTINGS_FILE)):
                try:
                    model = load_model_settings(path)
                except SettingsError as exc:
                    if path.parent.name == name:
                        problem = exc
                    continue
                if model.name == name:
                    found.append(model)
        if not found:
            found = [m for m in known if m.name == name]
        if not found:
            if problem is not None:
                raise BadInput(str(problem))
            raise ModelNotFound(f"model {name!r} is not in the model repository")
        return self.apply_overrides(found)
