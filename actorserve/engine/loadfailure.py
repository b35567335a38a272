"""What a failed model load says: the underlying error and where in the model's own code
it came from, never the wrapper it travelled in.

A model's ``load()`` runs inside trio nurseries (the engine's, the host's), so what
reaches the engine is ``ExceptionGroup: Exceptions from Trio nursery (1 sub-exception)``.
:func:`underlying` digs out the error the model raised; :func:`where` finds the innermost
line of the model's code in its traceback (a file of the model's folder, or the file
that defines the model class), so a message reads::

    loading model 'bad' failed: RuntimeError: weights file missing (bad/model.py, line 6, in load)

The full traceback still goes to the log; the message is what a client and the index read.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import trio


def underlying(error: BaseException) -> BaseException:
    """The first error in ``error`` that is not an exception group (nor a trio
    ``Cancelled`` beside a real error); ``error`` itself when it is none."""
    leaves = list(_leaves(error))
    real = [leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled)]
    return (real or leaves or [error])[0]


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for sub in error.exceptions:
            yield from _leaves(sub)
    else:
        yield error


def where(error: BaseException, folder: Path | None, model_class: type | None = None) -> str:
    """``file, line N, in function`` of the innermost traceback frame in the model's own
    code: a file under ``folder`` (its path shown from the folder's parent, so it names
    the model folder too), else the file defining ``model_class``. A ``SyntaxError`` in
    such a file is placed by its own file and line. "" when no frame is the model's."""
    own = _own_files(folder, model_class)
    if isinstance(error, SyntaxError) and error.filename and own(error.filename):
        return f"{_shown(error.filename, folder)}, line {error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if own(f.filename)]
    if not frames:
        return ""
    frame = frames[-1]
    return f"{_shown(frame.filename, folder)}, line {frame.lineno}, in {frame.name}"


def explain(error: BaseException, folder: Path | None, model_class: type | None = None) -> str:
    """``Type: message (file, line N, in function)`` for the error underneath ``error``."""
    cause = underlying(error)
    if isinstance(cause, SyntaxError):  # its str() repeats the file as a bare name
        text = f"{type(cause).__name__}: {cause.msg}"
    else:
        text = f"{type(cause).__name__}: {cause}"
    place = where(cause, folder, model_class)
    return f"{text} ({place})" if place else text


def _own_files(folder: Path | None, model_class: type | None) -> Callable[[str], bool]:
    """Whether a file is the model's own code: under its folder, else the class's file."""
    root = folder.resolve() if folder is not None else None
    defining: Path | None = None
    if root is None and model_class is not None:
        try:
            defining = Path(inspect.getfile(model_class)).resolve()
        except (TypeError, OSError):  # a class built at run time has no file
            defining = None

    def own(filename: str) -> bool:
        if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
            return False
        path = Path(filename).resolve()
        return path.is_relative_to(root) if root is not None else path == defining

    return own


def _shown(filename: str, folder: Path | None) -> str:
    """``filename`` from the model folder's parent (``bad/model.py``), else as it is."""
    if folder is not None:
        root = folder.resolve()
        path = Path(filename).resolve()
        if path.is_relative_to(root):
            return str(path.relative_to(root.parent))
    return filename
