"""The package's shape: no import cycles, one table of which layer may reach which, doors
that never reach each other (read from the server's list of doors), and
module size as a review signal: a module past :data:`MAX_LINES` is listed in
:data:`LONG_MODULES` with the reason it may be long (it is one thing) or the seam it will
be split along, so growth past the line is a decision someone wrote down, never packing.

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

#: the review line: past it a module needs an entry in LONG_MODULES
MAX_LINES = 400

#: generated code: sized by its .proto, never reviewed by length
GENERATED = (
    "actorserve/proto/inference/",
    "actorserve/proto/actorserve/v1/",
    "actorserve/proto/torchserve/org/",
    "actorserve/proto/torchserve/google/",
    "actorserve/proto/message_pool.py",
    "actorserve/proto/torchserve/message_pool.py",
    "actorserve/proto/upb_descriptor.py",
)

#: modules allowed past MAX_LINES, each with why (reviewed: an entry is a decision)
LONG_MODULES: dict[str, str] = {
    "actorserve/server/processes.py": "the parent's supervision of its children (start in order, watch, restart, the ordered stop); seam when it grows: run_parent and its signals to a module of their own",
    "actorserve/api.py": "one thing, the engine boundary: EngineAPI (each unary method written once, labelled @unary for actorserve/unarygen.py), the records it answers with, the enums; seam when it grows: the answer records (ModelInfo, ModelMetadata, ...) to a module of their own, as descriptions.py holds the management ones",
    "actorserve/engine/core.py": "one thing, the in-process EngineAPI (a method per engine operation; actorserve/unary.py routes the unary calls to them by name)",
    "actorserve/ipc/frames.py": "one thing, the link's messages and their codec: a class and an encode/decode pair per message, and the frame around them",
    "actorserve/codecs.py": "one thing, OIP tensors to and from JSON values, numpy and torch, each check with its message; the seam when it grows: the request and response documents (request_from_json and the others) into a module of their own",
    "actorserve/metrics.py": "one thing, the Prometheus families and who records them; the family declarations are most of it",
    "actorserve/models/vllm/runtime.py": "one thing, the vllm BatchModel (the load, a request's admission in prepare and begin, each step mapped onto vLLM's engine.step()); the seam when it grows: reading a request (its prompt, the bound, the tokenizer in a thread) into a module of its own",
    "actorserve/models/llm/runtime.py": "one thing, the transformers BatchModel (its request's admission in begin, the step); the seam when it grows: the load (device, dtype, checkpoint, tokenizer) into a module of its own",
    "actorserve/settings.py": "one thing, Settings: a field per server-wide setting with its check and its one help text (the CLI's and docs/cli.md's)",
    "actorserve/torchserve/handler_model.py": "one thing, a TorchServe handler run as a BatchModel (context, envelopes, stopping criteria)",
    "actorserve/transport/grpc/streams.py": "one thing, ModelStreamInfer: per-sequence ordering of a call's requests and its responses",
    "actorserve/transport/rest/wire.py": "one thing, the OIP REST wire (parse, validate, encode), no I/O",
}


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


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert [sorted(c) for c in cycles(graph())] == []


#: Which layer may import which: the one table of the package's shape (docs/architecture.md
#: shows it). A layer is a folder; ``ground`` is the root's plain modules (``api``,
#: ``types``, ``settings``, ...), ``entry`` the command line (``__main__``, ``clidocs``).
#: Checked on what a module *reaches* (every module it imports, and theirs, and the packages
#: they live in), so a door that reaches the engine through a shared module fails as surely
#: as one that imports it.
LAYERS: dict[str, frozenset[str]] = {
    "ground": frozenset(),
    "actors": frozenset({"ground"}),  # never a transport: the actors know no wire
    "torchserve": frozenset({"ground"}),  # TorchServe's handlers and archives, run by the engine
    "models": frozenset({"ground", "torchserve"}),
    "engine": frozenset({"ground", "actors", "models", "torchserve"}),
    "ipc": frozenset({"ground"}),  # the link's wire and the front's end (EngineClient)
    "ipc.engine_side": frozenset({"ground", "ipc", "engine", "actors", "models", "torchserve"}),
    "proto": frozenset({"ground"}),
    "transport": frozenset({"ground", "proto"}),  # the doors know the engine as EngineAPI only
    "server": frozenset(
        {"ground", "actors", "torchserve", "models", "engine", "ipc", "ipc.engine_side", "proto", "transport"}
    ),
    "entry": frozenset(
        {
            "ground",
            "actors",
            "torchserve",
            "models",
            "engine",
            "ipc",
            "ipc.engine_side",
            "proto",
            "transport",
            "server",
        }
    ),
}
ENTRY_POINTS = ("actorserve.__main__", "actorserve.clidocs")


def layer_of(name: str) -> str:
    """The layer of the module ``name`` (the package's face, ``actorserve`` itself, has none)."""
    if name in ENTRY_POINTS:
        return "entry"
    parts = name.split(".")
    assert len(parts) > 1, name
    if parts[1:3] == ["ipc", "engine_side"]:
        return "ipc.engine_side"
    if len(parts) == 2 and not (PACKAGE / parts[1]).is_dir():
        return "ground"
    assert parts[1] in LAYERS, f"{name}: a folder with no row in LAYERS"
    return parts[1]


def parents(name: str) -> list[str]:
    """The packages ``name`` lives in, below the face (``a.b.c`` -> ``a.b``)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def with_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` plus, for every import, the packages the imported module lives in (Python
    runs their ``__init__`` first)."""
    return {
        name: targets | {parent for target in targets for parent in parents(target) if parent in edges}
        for name, targets in edges.items()
    }


def reach(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every module each module reaches (the face ``actorserve`` is not followed)."""
    found: dict[str, set[str]] = {}
    for start in edges:
        seen: set[str] = set()
        todo = [target for target in edges[start] if target != "actorserve"]
        while todo:
            node = todo.pop()
            if node in seen or node == start:
                continue
            seen.add(node)
            todo.extend(target for target in edges.get(node, ()) if target != "actorserve")
        found[start] = seen
    return found


def test_every_module_reaches_only_the_layers_its_row_allows() -> None:
    reached = reach(with_packages(graph()))
    wrong = sorted(
        f"{name} ({layer_of(name)}) reaches {target} ({layer_of(target)})"
        for name, targets in reached.items()
        if name != "actorserve"
        for target in targets
        if layer_of(target) != layer_of(name) and layer_of(target) not in LAYERS[layer_of(name)]
    )
    assert wrong == []


def test_the_layer_check_sees_a_reach_through_a_shared_module() -> None:
    edges = {
        "actorserve.transport.x": {"actorserve.transport.y"},
        "actorserve.transport.y": {"actorserve.engine.core"},
        "actorserve.engine.core": set(),
        "actorserve.engine": {"actorserve.engine.core"},
    }
    assert {"actorserve.engine.core", "actorserve.engine"} <= reach(with_packages(edges))[
        "actorserve.transport.x"
    ]
    assert layer_of("actorserve.ipc.engine_side") == "ipc.engine_side"
    assert layer_of("actorserve.ipc.client") == "ipc"
    assert layer_of("actorserve.api") == "ground"
    assert layer_of("actorserve.engine") == "engine"
    assert layer_of("actorserve.clidocs") == "entry"


def test_every_folder_has_a_row() -> None:
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert folders <= set(LAYERS), folders - set(LAYERS)


DOORS_MODULE = PACKAGE / "server" / "doors.py"
TRANSPORT = "actorserve.transport"
#: the hosts: what every request of every door shares; they import no door
HOSTS = ("actorserve.transport.httphost", "actorserve.transport.grpchost")


def doors() -> set[str]:
    """The doors, as the server lists them: every package under ``transport/`` that
    ``server/doors.py`` imports, other than the hosts."""
    found = set()
    for target in imported("actorserve.server.doors", DOORS_MODULE, modules()):
        parts = target.split(".")
        if target.startswith(TRANSPORT + ".") and (PACKAGE / "transport" / parts[2]).is_dir():
            package = ".".join(parts[:3])
            if package not in HOSTS:
                found.add(package)
    return found


def door_of(name: str, listed: set[str]) -> str | None:
    return next((door for door in listed if name == door or name.startswith(door + ".")), None)


def test_no_door_reaches_another_door() -> None:
    """A door is one package: it uses the hosts, the transport's shared modules (errors,
    auth scopes, records) and the engine API, never another door, not even through a
    shared module."""
    listed = doors()
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in reach(with_packages(graph())).items()
        if (door := door_of(name, listed)) is not None
        for target in targets
        if door_of(target, listed) not in (None, door)
    )
    assert wrong == []


def test_the_hosts_and_shared_modules_reach_no_door() -> None:
    """The hosts are handed their doors (by actorserve.server.doors); neither they nor the
    transport's shared modules reach one."""
    listed = doors()
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in reach(with_packages(graph())).items()
        if name.startswith(TRANSPORT) and door_of(name, listed) is None
        for target in targets
        if door_of(target, listed) is not None
    )
    assert wrong == []


def test_the_doors_are_read_from_the_servers_list() -> None:
    listed = doors()
    assert listed == {
        "actorserve.transport.rest",
        "actorserve.transport.grpc",
        "actorserve.transport.openai",
        "actorserve.transport.torchserve",
        "actorserve.transport.playground",
        "actorserve.transport.grpcprobes",
    }
    assert door_of("actorserve.transport.openai.routes", listed) == "actorserve.transport.openai"
    assert door_of("actorserve.transport.httphost.protocols", listed) is None
    assert door_of("actorserve.transport.exchange", listed) is None


def test_torchserve_and_its_door_meet_only_through_the_engine_api() -> None:
    """The engine-side ``torchserve/`` (handlers, archives) and TorchServe's door share
    only the engine API (``torchserve_envelope`` is part of it)."""
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in reach(with_packages(graph())).items()
        if name.startswith("actorserve.transport.torchserve")
        for target in targets
        if target == "actorserve.torchserve" or target.startswith("actorserve.torchserve.")
    )
    assert wrong == []


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    edges = graph()
    assert "actorserve.actors.host" in edges["actorserve.engine.core"]
    assert "actorserve.models" in edges["actorserve.engine.core"]  # imported inside open_engine()
    assert "actorserve.server.composition" in edges["actorserve.server"]  # under TYPE_CHECKING


def checked_for_size() -> list[Path]:
    """Every module but generated code."""
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(GENERATED)
    ]


@pytest.mark.parametrize("path", checked_for_size(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_long_module_is_a_reviewed_decision(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    lines = len(path.read_text().splitlines())
    if name in LONG_MODULES:
        assert lines > MAX_LINES, f"{name}: {lines} lines, no longer long: drop its LONG_MODULES entry"
    else:
        assert lines <= MAX_LINES, (
            f"{name}: {lines} lines: split it along a seam, or list it in LONG_MODULES with why it is one thing"
        )


def test_every_long_module_entry_names_a_module() -> None:
    missing = [name for name in LONG_MODULES if not (ROOT / name).is_file()]
    assert missing == []


def test_no_fmt_skip_outside_generated_code() -> None:
    """``ruff format`` lays every module out; a line it would reflow is reflowed, not pinned."""
    pinned = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in [*checked_for_size(), *sorted((ROOT / "tests").rglob("*.py"))]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: " + "skip")
    ]
    assert pinned == []
