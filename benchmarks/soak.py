"""Long reliability runs (prints figures; not a test).

    python benchmarks/soak.py SCENARIO [options]     # one scenario, e.g. ``overload``
    python benchmarks/soak.py --list                 # the scenarios and what they show

Each scenario is a module in ``benchmarks/reliability/`` with a docstring (its first line
is what ``--list`` prints) and ``main(argv: list[str]) -> int``; scenarios may import the
tests' load clients from ``tests/support`` (on the path). Every scenario starts its
own servers on 127.0.0.1 with port 0, is bounded in time and in count, and prints one
table row per case with the figures that ``docs/reliability.md`` quotes. The fast cases
of the same scenarios run in CI from ``tests/reliability/``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "reliability"


def scenarios() -> dict[str, str]:
    """Scenario name → the first line of its docstring."""
    found: dict[str, str] = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = importlib.import_module(f"reliability.{path.stem}")
        found[path.stem] = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""
    return found


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE.parents[1] / "tests"))  # scenarios share the tests' clients (tests/support)
    if not argv or argv[0] in {"-h", "--help", "--list"}:
        print(__doc__)
        for name, line in scenarios().items():
            print(f"  {name:<14} {line}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in scenarios():
        print(f"no scenario {name!r}; --list shows them", file=sys.stderr)
        return 2
    module = importlib.import_module(f"reliability.{name}")
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
