"""The REST package's layering, read from its import statements: the wire modules do no
I/O, and nothing in the package reaches past the engine boundary."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import actorserve.transport.rest as rest

PACKAGE = Path(rest.__file__).parent


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, resolved to absolute names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "actorserve.transport.rest".split(".")[: 3 - node.level + 1]
                found.add(".".join([*base, *(node.module.split(".") if node.module else [])]))
            else:
                assert node.module is not None
                found.add(node.module)
    return found


@pytest.mark.parametrize("module", ["wire.py", "generate.py", "sse.py", "templates.py"])
def test_wire_modules_import_no_io_library(module: str) -> None:
    for name in imports(PACKAGE / module):
        assert name.split(".")[0] not in (
            "trio",
            "quart",
            "quart_trio",
            "hypercorn",
            "werkzeug",
            "asyncio",
        ), name


@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py")))
def test_no_module_reaches_past_the_engine_boundary(module: str) -> None:
    for name in imports(PACKAGE / module):
        assert not name.startswith(("actorserve.actors", "actorserve.engine", "grpclib")), name
    # size: tests/test_layout.py (LONG_MODULES), for every module alike
