"""Loading model code from model folders: each folder in a namespace of its own, afresh
on every load, with nothing left in sys.path / sys.modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import actorserve
from actorserve import BadInput, InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.engine.repository import ModelRepository, resolve_implementation
from actorserve.models.identity import IdentityModel
from actorserve.settings import ModelSettings, SettingsError, load_model_settings

#: a model whose one output ``said`` (BYTES [1]) is WORDS
ECHO = """
import numpy as np
from actorserve import Model
from actorserve.types import Tensor

WORDS = {words!r}

class {cls}(Model):
    async def predict(self, request):
        said = np.empty(1, dtype=object)
        said[0] = WORDS.encode()
        return self.response(request, [Tensor("said", (1,), "BYTES", said)])
"""


def write_model(folder: Path, name: str, files: dict[str, str], implementation: str = "echo.Echo") -> Path:
    model = folder / name
    model.mkdir(parents=True, exist_ok=True)
    (model / "model-settings.json").write_text(json.dumps({"name": name, "implementation": implementation}))
    for path, text in files.items():
        (model / path).parent.mkdir(parents=True, exist_ok=True)
        (model / path).write_text(text)
    return model


def echo(words: str, cls: str = "Echo") -> str:
    return ECHO.format(words=words, cls=cls)


async def said(engine: actorserve.Engine, model: str) -> bytes:
    request = InferenceRequest([tensor_from_numpy("x", np.array([1], dtype=np.int64))])
    response = await engine.infer(request, model=model)
    value = response.output("said").data[0]
    assert isinstance(value, bytes)
    return value


def leftovers(*names: str) -> list[str]:
    """Modules of these names (or a synthetic model package) still in sys.modules."""
    return sorted(m for m in sys.modules if m.partition(".")[0] in names or m.startswith("_actorserve_"))


async def test_two_folders_with_an_echo_py_each_run_their_own_code(tmp_path: Path) -> None:
    write_model(tmp_path, "a", {"echo.py": echo("I am a", "EchoA")}, "echo.EchoA")
    write_model(tmp_path, "b", {"echo.py": echo("I am b", "EchoB")}, "echo.EchoB")
    path_before = list(sys.path)
    repository = ModelRepository((tmp_path,))
    async with actorserve.open_engine(repository.discover(), repository=repository) as engine:
        assert await said(engine, "a") == b"I am a"
        assert await said(engine, "b") == b"I am b"
        assert [type(engine.model(n)).__name__ for n in ("a", "b")] == ["EchoA", "EchoB"]
    assert sys.path == path_before
    assert leftovers("echo") == []
    assert not (tmp_path / "a" / "__pycache__").exists()


async def test_a_load_after_an_edit_runs_the_edited_code(tmp_path: Path) -> None:
    model = write_model(tmp_path, "m", {"echo.py": echo("old")})
    repository = ModelRepository((tmp_path,))
    async with actorserve.open_engine(repository.discover(), repository=repository) as engine:
        assert await said(engine, "m") == b"old"
        (model / "echo.py").write_text(echo("new"))  # same size, same second: no stale bytecode
        await engine.load_from_repository("m")
        assert await said(engine, "m") == b"new"


async def test_sibling_modules_resolve_inside_the_folder(tmp_path: Path) -> None:
    """``from helpers import x`` and ``from .helpers import x`` find the folder's own
    helpers.py; a package of the folder works as an implementation too."""
    for name in ("x", "y"):
        write_model(
            tmp_path,
            name,
            {
                "helpers.py": f"WORDS = 'helper of {name}'\n",
                "tools/__init__.py": "",
                "tools/more.py": f"WORDS = 'more of {name}'\n",
                "echo.py": "from helpers import WORDS as A\nfrom .tools.more import WORDS as B\n"
                + echo("").replace("WORDS = ''", "WORDS = A + ' / ' + B"),
            },
        )
    write_model(
        tmp_path, "p", {"pkg/__init__.py": "", "pkg/model.py": echo("in a package")}, "pkg.model.Echo"
    )
    repository = ModelRepository((tmp_path,))
    async with actorserve.open_engine(repository.discover(), repository=repository) as engine:
        assert await said(engine, "x") == b"helper of x / more of x"
        assert await said(engine, "y") == b"helper of y / more of y"
        assert await said(engine, "p") == b"in a package"
    assert leftovers("echo", "helpers", "tools", "pkg") == []


def test_an_implementation_outside_the_folder_imports_normally(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "i", {}, "actorserve.models.identity.IdentityModel")
    assert resolve_implementation(load_model_settings(folder)) is IdentityModel
    assert resolve_implementation(ModelSettings(name="c", implementation=IdentityModel)) is IdentityModel


@pytest.mark.parametrize(
    ("files", "implementation", "error"),
    [
        (
            {"echo.py": "def broken(:\n"},
            "echo.Echo",
            "model 'm': cannot import 'echo.Echo': SyntaxError: invalid syntax (m/echo.py, line 1)",
        ),
        (
            {"echo.py": "X = 1\nraise RuntimeError('boom')\n"},
            "echo.Echo",
            "model 'm': cannot import 'echo.Echo': RuntimeError: boom (m/echo.py, line 2, in <module>)",
        ),
        ({"echo.py": "X = 1\n"}, "echo.Echo", "model 'm': cannot import 'echo.Echo': module "),
        ({"echo.py": "class Echo: pass\n"}, "echo.Echo", "model 'm': 'echo.Echo' is not an actorserve Model"),
        (
            {"echo.py": "import no_sibling_here\n"},
            "echo.Echo",
            "model 'm': cannot import 'echo.Echo': ModuleNotFoundError: No module named 'no_sibling_here'"
            " (m/echo.py, line 1, in <module>)",
        ),
        ({}, "Echo", "model 'm': implementation 'Echo' is not 'module.Class'"),
    ],
)
def test_bad_model_code_is_a_settings_error(
    tmp_path: Path, files: dict[str, str], implementation: str, error: str
) -> None:
    folder = write_model(tmp_path, "m", files, implementation)
    with pytest.raises(SettingsError) as info:
        resolve_implementation(load_model_settings(folder))
    assert isinstance(info.value, BadInput)
    assert info.value.message.startswith(error)
    assert leftovers("echo") == []


async def test_a_broken_edit_keeps_the_loaded_version_serving(tmp_path: Path) -> None:
    model = write_model(tmp_path, "m", {"echo.py": echo("good")})
    repository = ModelRepository((tmp_path,))
    async with actorserve.open_engine(repository.discover(), repository=repository) as engine:
        (model / "echo.py").write_text("def broken(:\n")
        with pytest.raises(BadInput, match=r"cannot import .echo\.Echo.: SyntaxError"):
            await engine.load_from_repository("m")
        assert await said(engine, "m") == b"good"
