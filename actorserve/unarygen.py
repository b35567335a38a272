"""The code of the unary engine calls, written from :class:`~actorserve.api.EngineAPI`:
each ``@unary`` method's signature (names, annotations, defaults, result type) becomes

- its record, a frozen :class:`~actorserve.api.UnaryCall` whose fields are the
  parameters, and its row (:mod:`actorserve.unary_records`);
- the engine client's named method, one ``call`` of that record
  (:mod:`actorserve.ipc.unary_methods`, which ``EngineClient`` inherits).

So a signature is written once by hand, in ``api.py``, and mypy checks the written code
like any other (``EngineClient`` is an ``EngineAPI`` because its methods are the
protocol's own signatures). ``python -m actorserve.unarygen`` rewrites both files;
``--check`` only says whether they are out of date (exit code 1), and
``tests/test_unary.py`` fails while they are.

Why written files and not classes made at import: mypy sees only what is written, and
a newcomer reads a record or a client method where the import statement points.
"""

from __future__ import annotations

import builtins
import inspect
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from . import api
from .api import EngineAPI, unary_of

PACKAGE = Path(__file__).resolve().parent
RECORDS = PACKAGE / "unary_records.py"
METHODS = PACKAGE / "ipc" / "unary_methods.py"

_KEYWORD = inspect.Parameter.KEYWORD_ONLY
_PLAIN = (inspect.Parameter.POSITIONAL_OR_KEYWORD, _KEYWORD)


@attrs.frozen
class UnaryMethod:
    """One ``@unary`` method of the protocol, as the generator writes it."""

    name: str
    record: str
    remembered: bool
    #: the parameters after ``self``, annotations as written (strings)
    parameters: tuple[inspect.Parameter, ...]
    #: the result type as written (``list[ModelInfo]``)
    returns: str

    def signature(self) -> str:
        """``(self, name: str, *, grace: float | None = None) -> None``"""
        parts, starred = ["self"], False
        for parameter in self.parameters:
            if parameter.kind is _KEYWORD and not starred:
                parts.append("*")
                starred = True
            parts.append(_parameter(parameter))
        return f"({', '.join(parts)}) -> {self.returns}"

    def record_call(self) -> str:
        """``Unload(name, version, grace)`` (a record's fields are never keyword-only)."""
        return f"{self.record}({', '.join(p.name for p in self.parameters)})"


def _parameter(parameter: inspect.Parameter) -> str:
    text = f"{parameter.name}: {parameter.annotation}"
    if parameter.default is not inspect.Parameter.empty:
        text += f" = {parameter.default!r}"
    return text


def unary_methods(protocol: type[Any] = EngineAPI) -> list[UnaryMethod]:
    """The protocol's ``@unary`` methods in the order they are written (a subclass's
    after its bases'). ``TypeError`` for one the records cannot carry: a parameter
    that is ``*args``, ``**kwargs`` or positional-only, or not annotated; no result
    type; ``remembered`` with no answer to remember."""
    found: dict[str, UnaryMethod] = {}
    for cls in reversed(protocol.__mro__):
        for name, method in vars(cls).items():
            label = unary_of(method)
            if label is None or name in found:
                continue
            signature = inspect.signature(method)
            parameters = tuple(signature.parameters.values())[1:]  # self
            for parameter in parameters:
                if parameter.kind not in _PLAIN or not isinstance(parameter.annotation, str):
                    raise TypeError(f"{name}: a unary call's parameter is plain and annotated: {parameter}")
            if not isinstance(signature.return_annotation, str):
                raise TypeError(f"{name}: a unary call names its result type (-> ...)")
            if label.remembered and signature.return_annotation == "None":
                raise TypeError(f"{name}: a remembered call answers something (the client keeps it)")
            found[name] = UnaryMethod(
                name, label.record, label.remembered, parameters, signature.return_annotation
            )
    return list(found.values())


def _imports(methods: Sequence[UnaryMethod], api_module: str, needs: dict[str, set[str]]) -> tuple[str, str]:
    """The import lines (the standard library's, the package's) for ``needs`` (module ->
    names) and every name the annotations use: the package's from ``api_module``, the
    rest from where ``api`` has them."""
    names: set[str] = set()
    for method in methods:
        for text in [method.returns, *(str(p.annotation) for p in method.parameters)]:
            names.update(re.findall(r"[A-Za-z_]\w*", text))
    by_module = {module: set(wanted) for module, wanted in needs.items()}
    for name in names - set(dir(builtins)):
        if not hasattr(api, name):
            raise TypeError(f"{name}: a unary call's annotations name what actorserve.api imports")
        module = getattr(getattr(api, name), "__module__", "")
        by_module.setdefault(api_module if module.startswith("actorserve") else module, set()).add(name)

    def line(module: str) -> str:
        return f"from {module} import {', '.join(sorted(by_module[module]))}"

    plain = sorted(m for m in by_module if not m.startswith("."))
    ours = sorted((m for m in by_module if m.startswith(".")), key=lambda m: (-m.count("."), m))
    return "\n".join(map(line, plain)), "\n".join(map(line, ours))


def render_records(methods: Sequence[UnaryMethod]) -> str:
    """The text of :mod:`actorserve.unary_records` (before ``ruff format``)."""
    plain, ours = _imports(methods, ".api", {"typing": {"Any", "Final"}, ".api": {"UnaryCall"}})
    out = [
        '"""The records of the unary engine calls, one per ``@unary`` method of',
        ":class:`~actorserve.api.EngineAPI` (its parameters as fields, its result type as the",
        "``T`` of ``UnaryCall[T]``), and :data:`ROWS`, of which :mod:`actorserve.unary` makes",
        "its table.",
        "",
        "Written by ``python -m actorserve.unarygen`` from ``api.py``: do not edit.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        plain,
        "",
        "import attrs",
        "",
        ours,
        "",
    ]
    for method in methods:
        out += [
            "",
            "@attrs.frozen",
            f"class {method.record}(UnaryCall[{method.returns}]):",
            f'    """:meth:`~actorserve.api.EngineAPI.{method.name}`"""',
        ]
        if method.parameters:
            out.append("")
        out += [f"    {_parameter(p)}" for p in method.parameters]
        out.append("")
    out += [
        "",
        "#: each method's name on the engine link, its record, and whether a front may",
        "#: remember its answer (``@unary(..., remembered=True)``), in ``api.py``'s order",
        "ROWS: Final[tuple[tuple[str, type[UnaryCall[Any]], bool], ...]] = (",
        *(f"    ({m.name!r}, {m.record}, {m.remembered})," for m in methods),
        ")",
        "",
        "__all__ = [",
        '    "ROWS",',
        *(f'    "{m.record}",' for m in sorted(methods, key=lambda m: m.record)),
        "]",
    ]
    return "\n".join(out) + "\n"


def render_methods(methods: Sequence[UnaryMethod]) -> str:
    """The text of :mod:`actorserve.ipc.unary_methods` (before ``ruff format``)."""
    plain, ours = _imports(methods, "..api", {"typing": {"Any", "TypeVar"}, "..api": {"UnaryCall"}})
    records = sorted(m.record for m in methods)
    out = [
        '"""The engine client\'s unary methods: each ``@unary`` method of',
        ":class:`~actorserve.api.EngineAPI`, with its signature, as one :meth:`~UnaryMethods.call`",
        "of its record (:mod:`actorserve.unary_records`); ``EngineClient`` inherits them and",
        "sends the call. A ``remembered`` one first looks its answer up by the key",
        "``EngineClient.call`` keeps it under, before a record is built (``model_info`` and",
        "``metadata`` are asked before every gRPC stream message, OpenAI completion and REST",
        "``text_input`` generate; a frozen record costs ~1.4 us more to build and hash).",
        "",
        "Written by ``python -m actorserve.unarygen`` from ``api.py``: do not edit.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import abc",
        plain,
        "",
        ours,
        f"from ..unary_records import {', '.join(records)}",
        "",
        'T = TypeVar("T")',
        "",
        "",
        "class UnaryMethods(abc.ABC):",
        '    """EngineAPI\'s unary methods over :meth:`call` (see the module)."""',
        "",
        "    #: the answers of ``remembered`` calls by (record type, its fields...)",
        "    _remembered: dict[tuple[Any, ...], Any]",
        "",
        "    @abc.abstractmethod",
        "    async def call(self, request: UnaryCall[T]) -> T:",
        '        """Run a unary call given as its record."""',
    ]
    for method in methods:
        out += ["", f"    async def {method.name}{method.signature()}:"]
        call = f"self.call({method.record_call()})"
        if method.remembered:
            key = ", ".join([method.record, *(p.name for p in method.parameters)])
            out += [
                f"        remembered: {method.returns} | None = self._remembered.get(({key}))",
                f"        return remembered if remembered is not None else await {call}",
            ]
        elif method.returns == "None":
            out.append(f"        await {call}")
        else:
            out.append(f"        return await {call}")
    return "\n".join(out) + "\n"


def formatted(text: str, path: Path) -> str:
    """``text`` laid out by ``ruff format`` (the project's formatter; the test extra has it)."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    return result.stdout


def rendered(protocol: type[Any] = EngineAPI) -> dict[Path, str]:
    """Each written file's path -> its text, formatted."""
    methods = unary_methods(protocol)
    renderers: dict[Path, Callable[[Sequence[UnaryMethod]], str]] = {
        RECORDS: render_records,
        METHODS: render_methods,
    }
    return {path: formatted(render(methods), path) for path, render in renderers.items()}


def main(argv: Sequence[str] = ()) -> int:
    texts = rendered()
    stale = {path: text for path, text in texts.items() if not path.is_file() or path.read_text() != text}
    for path, text in stale.items():
        if "--check" in argv:
            print(f"{path.relative_to(PACKAGE.parent)} is out of date: run python -m actorserve.unarygen")
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(PACKAGE.parent)}")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
