"""ruff (with the ASYNC rules), ruff format and mypy --strict run as part of the test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff() -> None:
    result = run("ruff", "check", "actorserve", "tests", "examples", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    """The layout is the formatter's (generated code is excluded in pyproject.toml)."""
    result = run("ruff", "format", "--check", "actorserve", "tests", "examples", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = run("mypy")  # strict, on the package: see [tool.mypy] in pyproject.toml
    assert result.returncode == 0, result.stdout + result.stderr
