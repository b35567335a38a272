"""What a fresh clone needs to pass its own tests: nothing read from outside the
repository (the tokenizer's training text ships in tests/data), and one policy for the
system programs some tests drive (``.ci/system-packages`` installs them, the README names
it, a test whose program is missing skips with that command, CI turns such a skip into
a failure)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support import programs, tiny_llm

ROOT = Path(__file__).resolve().parents[1]
#: the trees whose code runs (documentation may name ../shared as an argument to pass)
CODE = ("actorserve", "benchmarks", "examples", "tests", ".ci", "deploy")
#: a path that leaves the tree: the sibling shared/ folder, or this machine's /work
OUTSIDE = re.compile(r"""\.\./shared|/work/|["']shared["']\s*[/,)]|/\s*["']shared["']""")


def code_files() -> list[Path]:
    found = []
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*")):
            if path == Path(__file__).resolve() or "__pycache__" in path.parts:
                continue  # this file spells the patterns out
            if path.is_file() and path.suffix not in (".txt", ".png", ".mar", ".pt", ".safetensors", ".bin"):
                found.append(path)
    return found


def test_no_code_reads_outside_the_repository() -> None:
    offenders = []
    for path in code_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_tokenizer_trains_on_the_text_shipped_in_tests_data() -> None:
    assert tiny_llm.DATA.is_relative_to(ROOT / "tests" / "data")
    text = tiny_llm.training_text()
    assert len(text) == 200_000
    assert text.startswith("First Citizen:\n")
    assert "tinyshakespeare.txt" in (ROOT / "tests" / "data" / "README.md").read_text()


def test_a_missing_training_text_is_an_error_never_another_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tiny_llm, "DATA", tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=r"missing\.txt is missing"):
        tiny_llm.training_text()


def packages_script() -> tuple[list[str], list[str]]:
    """The packages ``.ci/system-packages`` installs and the program each provides."""
    text = programs.INSTALL_SCRIPT.read_text()
    packages = re.search(r"^PACKAGES=\(([^)]*)\)", text, re.M)
    binaries = re.search(r"^PROGRAMS=\(([^)]*)\)", text, re.M)
    assert packages is not None and binaries is not None
    return packages[1].split(), binaries[1].split()


def test_the_readme_names_every_system_package_and_the_command_beside_the_test_command() -> None:
    packages, binaries = packages_script()
    assert len(packages) == len(binaries)
    assert {"chromium", "curl", "haproxy", "nginx-light"} <= set(packages)
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert programs.INSTALL_COMMAND in first_block
    assert ".venv/bin/python -m pytest" in first_block
    text = " ".join(readme.split())
    for package in packages:
        assert f"`{package}`" in text, package
    assert programs.REQUIRE in text


def test_ci_installs_the_system_packages_and_fails_on_a_missing_program() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\.ci/system-packages$", run, re.M)
    assert re.search(rf"^export {programs.REQUIRE}=1$", run, re.M)
    assert run.index(".ci/system-packages") < run.index(f"export {programs.REQUIRE}=1")
    assert programs.INSTALL_SCRIPT.stat().st_mode & 0o111  # runs as the README writes it
    checked = subprocess.run(["bash", "-n", str(programs.INSTALL_SCRIPT)], capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_a_missing_program_skips_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(programs.REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no-such-program-33 is not installed \(a test\).*"):
        programs.require_program("no-such-program-33", "a test")
    try:
        programs.require_program("no-such-program-33", "a test")
    except pytest.skip.Exception as skipped:
        assert str(skipped.msg).endswith(
            f"install the suite's system packages with: {programs.INSTALL_COMMAND}"
        )


def test_a_missing_program_fails_where_ci_requires_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(programs.REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match=re.escape(programs.INSTALL_COMMAND)):
        programs.require_program("no-such-program-33", "a test")


def test_a_present_program_is_found_by_its_path() -> None:
    assert programs.require_program("bash", "a test") == programs.find_program("bash")
