"""The model repository: where model versions come from, and how their code is loaded.

``ModelRepository`` knows the model folders given on the command line (re-read on every
load request, so a model added or changed on disk can be loaded) and the models given in
code.

Loading a model folder's code (:func:`resolve_implementation`): when the first part of
``implementation`` ("echo" of "echo.Echo") is a module or package in the model's folder,
the folder is imported as a package of its own, with a name unique to this load
(``_actorserve_echo_3``), from source, every time. So two folders that each hold an
``echo.py`` each run their own code, and a load request after an edit runs the edited
code. While the model's module runs (the import), its folder's other modules are
importable by their own names (``from helpers import x``, as with MLServer's ``sys.path``)
and relatively (``from .helpers import x``); afterwards neither the folder nor these
modules are left in ``sys.path`` / ``sys.modules``, so import siblings at module level,
not inside functions. Any other ``implementation`` (``actorserve.models.identity.
IdentityModel``, an installed package) is imported normally.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import re
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import attrs
import trio

from ..errors import BadInput, ModelNotFound
from ..model import Model
from ..settings import (
    MODEL_SETTINGS_FILE,
    ModelSettings,
    Settings,
    SettingsError,
    discover_models,
    load_model_settings,
)
from ..torchserve.archive import ArchiveLimits, Overrides, archive_name, archive_settings, find_archives
from .loadfailure import explain, where
from .overrides import LoadOverrideRefused, allows, check_registration, needs_declaration, override_settings


@attrs.frozen
class ModelRepository:
    """Where models come from: the model folders given on the command line (re-read on
    every ``load`` request, so a model added or changed on disk can be loaded) and the
    models given in code. ``workers`` overrides every model's ``workers``."""

    folders: tuple[Path, ...] = ()
    workers: int | None = None
    #: how much a ``.mar`` may hold (:meth:`with_archive_limits` takes them from settings)
    archive_limits: ArchiveLimits = attrs.field(factory=ArchiveLimits)

    def with_archive_limits(self, settings: Settings) -> ModelRepository:
        """This repository with the archive limits of the server's ``settings``."""
        limits = ArchiveLimits(settings.max_archive_bytes, settings.max_archive_members)
        return attrs.evolve(self, archive_limits=limits)

    def discover(self, archives: bool = True) -> list[ModelSettings]:
        """Every model in the folders; :class:`SettingsError` names a bad file. An empty
        folder (no ``model-settings.json``, no archive: a TorchServe model store before
        its first registration) holds no model (see :meth:`empty_folders`).
        ``archives=False`` (the parent of the multi-process server, which only checks the
        files before its engine loads them) leaves the ``.mar`` archives unextracted and
        out of the list: only the process that loads the models extracts them."""
        models: list[ModelSettings] = []
        for folder in self.folders:
            found = find_archives(Path(folder))
            if not found and Path(folder).is_dir() and not any(Path(folder).rglob(MODEL_SETTINGS_FILE)):
                continue
            if not found or any(Path(folder).rglob(MODEL_SETTINGS_FILE)):
                models.extend(discover_models(folder))
            if archives:
                models.extend(archive_settings(path, limits=self.archive_limits) for path in found)
        return self.apply_overrides(models)

    def empty_folders(self) -> list[Path]:
        """The model folders that hold no model yet (no ``model-settings.json``, no archive)."""
        return [
            Path(folder)
            for folder in self.folders
            if Path(folder).is_dir()
            and not find_archives(Path(folder))
            and not any(Path(folder).rglob(MODEL_SETTINGS_FILE))
        ]

    def apply_overrides(self, models: Iterable[ModelSettings]) -> list[ModelSettings]:
        if self.workers is None:
            return list(models)
        return [attrs.evolve(m, workers=self.workers) for m in models]

    def scan(self) -> tuple[list[ModelSettings], dict[str, str]]:
        """Every model in the folders that reads, and why the others do not (the name of
        the folder holding a broken ``model-settings.json`` -> the readable error)."""
        models: list[ModelSettings] = []
        problems: dict[str, str] = {}
        for folder in self.folders:
            for path in sorted(Path(folder).rglob(MODEL_SETTINGS_FILE)):
                try:
                    models.append(load_model_settings(path))
                except SettingsError as exc:
                    problems[path.parent.name] = str(exc)
        return self.apply_overrides(models), problems

    def locate(self, path: str, anywhere: bool = False) -> Path:
        """A model archive's path: absolute, or relative to the first model folder
        (TorchServe's model store); ``file://`` URLs too. :class:`BadInput` for a URL
        to download, a path that does not exist, or (unless ``anywhere``: the operator
        allows ``url``) one outside every model folder: a registration must not make the
        engine run the code of an archive or folder the operator did not put there."""
        if path.startswith("file://"):
            path = path[len("file://") :]
        elif "://" in path:
            raise BadInput(f"cannot load {path!r}: only archives on the server's disk load (no downloads)")
        if "\x00" in path:  # no file has such a name (and resolving it would raise ValueError)
            raise BadInput(f"model archive {path!r} not found")
        found = Path(path)
        if not found.is_absolute() and self.folders:
            found = self.folders[0] / found
        if not anywhere and not any(found.resolve().is_relative_to(f.resolve()) for f in self.folders):
            raise LoadOverrideRefused(
                f"registering {path!r}",
                "url",
                "'url' must name an archive in the model store (one of the model folders)",
            )
        if not found.exists():
            raise BadInput(f"model archive {path!r} not found")
        return found

    async def archive(self, path: str, allowed: Collection[str] = (), **overrides: Any) -> ModelSettings:
        """The settings of the TorchServe archive at ``path`` (:meth:`locate`), with
        :class:`~actorserve.torchserve.archive.Overrides` fields; :class:`SettingsError`.
        ``allowed``: the operator's ``allow_load_overrides`` (``url``: an archive outside
        the model folders; ``handler``: another handler than the manifest's). Extracted
        in a worker thread: a large archive never stalls the event loop."""
        check_registration(path, overrides.get("handler"), allowed)
        located = self.locate(path, anywhere=allows(allowed, "url"))
        extract = functools.partial(archive_settings, located, Overrides(**overrides), self.archive_limits)
        return await trio.to_thread.run_sync(extract)

    def override(
        self, settings: ModelSettings, config: Mapping[str, Any], allowed: Collection[str] = ()
    ) -> ModelSettings:
        """``settings`` with a load request's ``parameters.config`` over it
        (:func:`~actorserve.engine.overrides.override_settings`); the model's class is imported
        for its ``overridable_parameters`` only when a ``parameters`` key needs them."""
        declared: frozenset[str] = frozenset()
        if needs_declaration(config, allowed):
            declared = self.implementation(settings).overridable_parameters
        return override_settings(settings, config, allowed, declared)

    def implementation(self, settings: ModelSettings) -> type[Model]:
        """The model class of ``settings``, its folder's code imported afresh
        (:func:`resolve_implementation`); :class:`SettingsError` says why not."""
        return resolve_implementation(settings)

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
            for archive in find_archives(Path(folder)):  # TorchServe archives, by manifest name
                if archive_name(archive) == name:
                    found.append(archive_settings(archive, limits=self.archive_limits))
        if not found:
            found = [m for m in known if m.name == name]
        if not found:
            if problem is not None:
                raise BadInput(str(problem))
            raise ModelNotFound(f"model {name!r} is not in the model repository")
        return self.apply_overrides(found)


#: built-in runtimes by short name (``"implementation": "transformers"``)
SHORT_NAMES = {
    "transformers": "actorserve.models.llm.TransformersModel",
    "vllm": "actorserve.models.vllm.VLLMModel",
}


def resolve_implementation(settings: ModelSettings) -> type[Model]:
    """The model class named by ``implementation`` ("module.Class" or a class).

    A module of the model's folder is imported afresh in a namespace of its own (see the
    module docstring). :class:`SettingsError` (a :class:`BadInput`) names the model and
    the problem when the module cannot be imported, fails while it runs, or does not
    hold an actorserve :class:`Model`."""
    impl = settings.implementation
    impl = SHORT_NAMES.get(impl, impl) if isinstance(impl, str) else impl
    if isinstance(impl, type):
        cls: object = impl
    else:
        module_name, _, attr = str(impl).rpartition(".")
        if not module_name or not attr:
            raise SettingsError(f"model {settings.name!r}: implementation {impl!r} is not 'module.Class'")
        folder = settings.folder
        try:
            if folder is not None and _in_folder(Path(folder), module_name.partition(".")[0]):
                module = _import_from_folder(Path(folder), module_name, settings.name)
            else:
                module = importlib.import_module(module_name)
            cls = getattr(module, attr)
        except (ImportError, AttributeError) as exc:
            # the class or its module missing: the message says it all; an import in the
            # model's own code that fails: which error, on which line
            cause = explain(exc, folder) if where(exc, folder) else str(exc)
            raise SettingsError(f"model {settings.name!r}: cannot import {impl!r}: {cause}") from exc
        except Exception as exc:  # the model's module failed while it ran (SyntaxError, ...)
            cause = explain(exc, folder)
            raise SettingsError(f"model {settings.name!r}: cannot import {impl!r}: {cause}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise SettingsError(f"model {settings.name!r}: {impl!r} is not an actorserve Model")
    return cls


#: numbers the folder loads, so each gets a package name of its own
_loads = itertools.count(1)


def _in_folder(folder: Path, top: str) -> bool:
    """``top`` is a module (``top.py``) or a package (``top/__init__.py``) of ``folder``."""
    return top.isidentifier() and (
        (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()
    )


def _import_from_folder(folder: Path, module_name: str, model: str) -> ModuleType:
    """Import ``module_name`` of ``folder`` as ``<unique package>.<module_name>``, then take
    the package, its modules and the folder's siblings imported by name out of
    ``sys.modules`` again (the model's class keeps what it needs alive)."""
    package = f"_actorserve_{re.sub(r'[^0-9A-Za-z_]', '_', model)}_{next(_loads)}"
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    sys.modules[package] = importlib.util.module_from_spec(spec)
    finder = _FolderFinder(package, folder)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(f"{package}.{module_name}")
    finally:
        sys.meta_path.remove(finder)
        for name in (package, *finder.created):
            sys.modules.pop(name, None)


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds, during one load, ``<package>.x.y`` and the folder's own top-level modules
    ``x.y`` in the model folder, loaded by :class:`_SourceLoader`."""

    def __init__(self, package: str, folder: Path) -> None:
        self.package = package
        self.prefix = package + "."
        self.folder = folder
        #: the module names this finder gave a spec for (each is removed after the load)
        self.created: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(self.prefix):
            parts = fullname[len(self.prefix) :].split(".")
        else:
            parts = fullname.split(".")
            if not _in_folder(self.folder, parts[0]):
                return None
        base = self.folder.joinpath(*parts)
        if (base / "__init__.py").is_file():
            location, search = base / "__init__.py", [str(base)]
        elif base.with_name(base.name + ".py").is_file():
            location, search = base.with_name(base.name + ".py"), None
        else:
            return None
        self.created.append(fullname)
        return importlib.util.spec_from_file_location(
            fullname,
            location,
            loader=_SourceLoader(fullname, str(location)),
            submodule_search_locations=search,
        )


class _SourceLoader(importlib.machinery.SourceFileLoader):
    """Compiles from source on every load: a ``.pyc`` written within the same second as
    an edit of the same size would otherwise hide the edit. Writes no ``__pycache__``."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)
