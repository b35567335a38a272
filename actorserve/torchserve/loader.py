"""Finding a handler's entry point, as TorchServe's ``TsModelLoader`` does.

``handler`` is ``module[.py][:function]``: a module of the model folder, else one of
``ts.torch_handler`` (``image_classifier``, ...: needs ``actorserve[torchserve]``). With
a function (default ``handle``) that the module has, that function is the entry point
and is first called as ``handle(None, context)`` to initialize; otherwise the module must
define exactly one class, whose instance's ``initialize(context)`` and ``handle`` are
used. While the handler is imported and initialized, the model folder is first on
``sys.path`` (a handler imports its ``model.py`` by name, as BaseHandler does); the
folder's modules are taken out of ``sys.modules`` afterwards, so two models with a
``model.py`` each keep their own.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from ..settings import SettingsError

EntryPoint = Callable[[Any, Any], Any]

#: sys.path and sys.modules are process-wide: one model loads at a time
_LOADING = threading.Lock()


@contextlib.contextmanager
def model_folder_importable(model_dir: Path) -> Iterator[None]:
    """``model_dir`` first on ``sys.path``; its modules leave ``sys.modules`` after."""
    folder = str(model_dir.resolve())
    with _LOADING:
        before = set(sys.modules)
        sys.path.insert(0, folder)
        try:
            yield
        finally:
            sys.path.remove(folder)
            for name in set(sys.modules) - before:
                file = getattr(sys.modules[name], "__file__", None) or ""
                if file.startswith(folder):
                    del sys.modules[name]


class _Demote(logging.Filter):
    """Logs ``messages`` (WARNINGs of a ``ts`` logger) at ``level`` instead."""

    def __init__(self, level: int, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.level = level
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not any(m in str(record.msg) for m in self.messages):
            return True
        record.levelno, record.levelname = self.level, logging.getLevelName(self.level)
        return logging.getLogger(record.name).isEnabledFor(self.level)


#: TorchServe's WARNINGs that are no problem here, at the level they deserve: importing
#: BaseHandler says which optional accelerators are not installed (DEBUG: a handler that
#: uses one fails on its own terms), and one without a label file says so (INFO). At
#: ``--log-level warning`` they were the whole log of a healthy start.
_TS_NOTICES: dict[str, _Demote] = {
    "ts.torch_handler.base_handler": _Demote(
        logging.DEBUG,
        ("OpenVINO is not enabled", "proceeding without onnxruntime", "Torch TensorRT not enabled"),
    ),
    "ts.utils.util": _Demote(logging.INFO, ("Inference output will not include class name",)),
}


def quiet_ts_notices() -> None:
    """Put :data:`_TS_NOTICES`' filters on their loggers (once; before ``ts`` is imported)."""
    for name, notice in _TS_NOTICES.items():
        logger = logging.getLogger(name)
        if notice not in logger.filters:
            logger.addFilter(notice)


def _module(handler: str, model: str) -> tuple[ModuleType, str | None]:
    module_name, _, function = handler.partition(":")
    module_name = module_name.removesuffix(".py").split("/")[-1]
    try:
        return importlib.import_module(module_name), function or None
    except ImportError as first:
        if first.name != module_name:  # the handler itself failed to import something
            raise SettingsError(f"model {model!r}: handler {handler!r} cannot be imported: {first}") from None
    try:
        return importlib.import_module(f".{module_name}", "ts.torch_handler"), function or None
    except ImportError:
        raise SettingsError(
            f"model {model!r}: handler {handler!r} is neither a module of the model folder nor one of "
            "TorchServe's default handlers (those need: pip install 'actorserve[torchserve]')"
        ) from None


def load_entry_point(handler: str, model: str, context: Any) -> tuple[EntryPoint, Any]:
    """Import the handler and initialize it with ``context`` (call with the model
    folder importable); returns (entry point, the handler object or module)."""
    quiet_ts_notices()
    module, function = _module(handler, model)
    function = function or "handle"
    if hasattr(module, function):
        entry: EntryPoint = getattr(module, function)
        entry(None, context)
        return entry, module
    classes = [
        cls for _, cls in inspect.getmembers(module, inspect.isclass) if cls.__module__ == module.__name__
    ]
    if len(classes) != 1:
        raise SettingsError(
            f"model {model!r}: handler {handler!r}: expected only one class in custom service code or a "
            f"function entry point, found {[c.__name__ for c in classes]}"
        )
    service: Any = classes[0]()
    if not hasattr(service, "handle"):
        raise SettingsError(f"model {model!r}: handler class {classes[0].__name__} has no handle method")
    service.initialize(context)
    return service.handle, service
