"""The package's shape: no import cycles, the actors never import a transport, and
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

TRANSPORT = "actorserve.transport"
ACTORS = "actorserve.actors"
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
    "actorserve/engine.py": "one thing, the in-process EngineAPI (a method per engine operation; actorserve/unary.py routes the unary ones to it by record)",
    "actorserve/ipc/client.py": "one thing, the front's EngineAPI over the engine link; issue 20's per-step link replaces its per-response half",
    "actorserve/ipc/frames.py": "one thing, the link's messages and their codec: a class and an encode/decode pair per message, and the frame around them",
    "actorserve/metrics.py": "one thing, the Prometheus families and who records them; the family declarations are most of it",
    "actorserve/settings.py": "one thing, Settings: a field per server-wide setting with its check and its one help text (the CLI's and docs/cli.md's)",
    "actorserve/torchserve/handler_model.py": "one thing, a TorchServe handler run as a BatchModel (context, envelopes, stopping criteria)",
    "actorserve/transport/grpc/streams.py": "one thing, ModelStreamInfer: per-sequence ordering of a call's requests and its responses",
    "actorserve/transport/rest/openapi.py": "one thing, the OpenAPI 3.1 document of the REST surface, mostly data",
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


#: the doors: each one package under transport/ (issue 21); the server lists them (doors.py)
DOORS = {
    "actorserve.transport.rest": "the OIP's REST API",
    "actorserve.transport.grpc": "Triton's gRPC services (and actorserve.v1.Management)",
    "actorserve.transport.openai": "the OpenAI API",
    "actorserve.transport.torchserve": "TorchServe's REST APIs and gRPC services",
    "actorserve.transport.playground": "the browser playground",
}
#: the hosts: what every request of every door shares; they import no door
HOSTS = ("actorserve.transport.httphost", "actorserve.transport.grpchost")


def door_of(name: str) -> str | None:
    return next((door for door in DOORS if name == door or name.startswith(door + ".")), None)


def host_of(name: str) -> str | None:
    return next((host for host in HOSTS if name == host or name.startswith(host + ".")), None)


def test_no_door_imports_another_door() -> None:
    """A door is one package: it uses the hosts, the transport's shared modules
    (errors, auth scopes, records) and the engine API, never another door."""
    wrong = {
        f"{name} -> {target}"
        for name, targets in graph().items()
        if (door := door_of(name)) is not None
        for target in targets
        if door_of(target) not in (None, door)
    }
    assert wrong == set()


def test_the_hosts_import_no_door() -> None:
    """The hosts are handed their doors (by actorserve.doors); they never name one."""
    edges = graph()
    wrong = {
        f"{name} -> {target}"
        for name, targets in edges.items()
        if host_of(name) is not None
        for target in targets
        if door_of(target) is not None
    }
    assert wrong == set()
    assert (
        "actorserve.transport.httphost.protocols" in edges["actorserve.transport.httphost.serve"]
    )  # the graph sees the hosts


def test_torchserve_and_its_door_meet_only_through_the_engine_api() -> None:
    """The engine-side ``torchserve/`` (handlers, archives) and TorchServe's door share
    only the engine API (``torchserve_envelope`` is part of it)."""
    engine_side = "actorserve.torchserve"
    door = "actorserve.transport.torchserve"
    wrong = {
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if (name.startswith(door) and (target == engine_side or target.startswith(engine_side + ".")))
        or (name.startswith(engine_side + ".") and in_transport(target))
    }
    assert wrong == set()


def test_the_door_checks_see_a_door_importing_another() -> None:
    assert door_of("actorserve.transport.openai.routes") == "actorserve.transport.openai"
    assert door_of("actorserve.transport.httphost.protocols") is None
    assert door_of("actorserve.transport.grpchost.h2") is None
    assert door_of("actorserve.transport.exchange") is None
    assert host_of("actorserve.transport.grpchost.h2") == "actorserve.transport.grpchost"
    assert all(name in modules() for name in [*DOORS, *HOSTS])


def test_the_fronts_engine_client_does_not_import_the_engine() -> None:
    """The front's end of the engine link (ipc/client.py) implements EngineAPI over the
    link; a helper it shares with the engine lives beside both (exceptiongroups.py)."""
    edges = graph()
    for name in ("actorserve.ipc.client", "actorserve.ipc.call_ends"):
        assert "actorserve.engine" not in edges[name], name


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    edges = graph()
    assert "actorserve.actors.host" in edges["actorserve.engine"]
    assert "actorserve.models" in edges["actorserve.engine"]  # imported inside open_engine()


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
