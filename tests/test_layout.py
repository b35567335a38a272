"""The package's shape: no import cycles, the actors never import a transport, and
modules small enough to read.

The import graph is read from the source (every ``import`` statement, including those
under ``if TYPE_CHECKING:`` and inside functions), not from ``sys.modules``, so a
cycle hidden behind a lazy import still counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "actorserve"

TRANSPORT = "actorserve.transport"
ACTORS = "actorserve.actors"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert "actorserve.actors.host" in found
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The actorserve modules ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; otherwise it is a name
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def in_transport(name: str) -> bool:
    return name == TRANSPORT or name.startswith(TRANSPORT + ".")


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert [sorted(c) for c in cycles(graph())] == []


def test_transports_import_nothing_from_the_actors() -> None:
    """The front doors know the engine only through actorserve.api (EngineAPI)."""
    wrong = {
        f"{name} -> {target}"
        for name, targets in graph().items()
        if in_transport(name)
        for target in targets
        if target == ACTORS or target.startswith(ACTORS + ".") or target == "actorserve.engine"
    }
    assert wrong == set()


def test_actors_import_no_transport() -> None:
    edges = graph()
    wrong = {
        f"{name} -> {target}"
        for name, targets in edges.items()
        if name.startswith("actorserve.actors")
        for target in targets
        if in_transport(target)
    }
    assert wrong == set()


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    edges = graph()
    assert "actorserve.actors.host" in edges["actorserve.engine"]
    assert "actorserve.models" in edges["actorserve.engine"]  # imported inside open_engine()


def checked_for_size() -> list[Path]:
    """Every module but generated code."""
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(("actorserve/proto/inference", "actorserve/proto/actorserve/v1"))
    ]


@pytest.mark.parametrize("path", checked_for_size(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines"
