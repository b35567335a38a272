"""What a load request may override (actorserve.engine.overrides), without a server: the
policy, when the model's class is read for its declaration, and the operator setting."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar

import pytest

from actorserve.engine.overrides import LoadOverrideRefused, override_settings
from actorserve.engine.repository import ModelRepository
from actorserve.model import Model
from actorserve.settings import BadSetting, ModelSettings, Settings, SettingsError, load_model_settings

#: a model of a folder that counts how often its module runs (in a file beside it)
COUNTING = """
from pathlib import Path
from actorserve import Model

RUNS = Path(__file__).with_name("runs")
RUNS.write_text(str(int(RUNS.read_text() if RUNS.exists() else "0") + 1))

class Counting(Model):
    overridable_parameters = frozenset({"threshold"})
"""


class Declaring(Model):
    overridable_parameters: ClassVar[frozenset[str]] = frozenset({"threshold"})


def settings(**changes: object) -> ModelSettings:
    values: dict[str, object] = {
        "name": "m",
        "implementation": Declaring,
        "parameters": {"threshold": 1, "uri": "/a"},
    }
    values.update(changes)
    return ModelSettings(**values)  # type: ignore[arg-type]


def test_declared_keys_merge_and_others_are_refused_naming_the_key_and_the_setting() -> None:
    merged = override_settings(
        settings(), {"parameters": {"threshold": 2}}, declared=frozenset({"threshold"})
    )
    assert merged.parameters == {"threshold": 2, "uri": "/a"}
    with pytest.raises(LoadOverrideRefused) as refused:
        override_settings(
            settings(), {"parameters": {"threshold": 2, "uri": "/b"}}, declared=frozenset({"threshold"})
        )
    assert refused.value.key == "uri"
    assert str(refused.value) == (
        "model 'm': parameters.config.parameters: 'uri' cannot be set by a load request: Declaring declares only "
        "['threshold', 'version'] safe to override, and other model parameters may name code, files, URLs or "
        "environment variables (the server's operator can allow it: --allow-load-overrides uri or "
        "ACTORSERVE_ALLOW_LOAD_OVERRIDES=uri)"
    )
    assert isinstance(refused.value, SettingsError)  # a BadInput: 400 / INVALID_ARGUMENT
    assert override_settings(settings(), {"parameters": {"version": "7"}}).version == "7"
    assert (
        override_settings(settings(), {"parameters": {"uri": "/b"}}, allowed=("uri",)).parameters["uri"]
        == "/b"
    )
    assert override_settings(settings(), {"parameters": {"x": 1}}, allowed=("*",)).parameters["x"] == 1
    assert override_settings(settings(), {"max_pending": 3}).max_pending == 3  # limits need no declaration


def test_the_repository_reads_the_class_declaration(tmp_path: Path) -> None:
    repository = ModelRepository()
    assert repository.override(settings(), {"parameters": {"threshold": 5}}).parameters["threshold"] == 5
    with pytest.raises(LoadOverrideRefused):
        repository.override(settings(), {"parameters": {"uri": "/b"}})


def test_a_folder_model_is_imported_for_its_declaration_only_when_a_key_needs_it(tmp_path: Path) -> None:
    folder = tmp_path / "counting"
    folder.mkdir()
    (folder / "counting.py").write_text(COUNTING)
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "counting", "implementation": "counting.Counting"})
    )
    model = load_model_settings(folder)
    repository = ModelRepository((tmp_path,))
    runs = folder / "runs"
    assert repository.override(model, {"max_pending": 3, "parameters": {"version": "2"}}).max_pending == 3
    assert repository.override(model, {"parameters": {"uri": "x"}}, allowed=("uri",)).parameters == {
        "uri": "x"
    }
    assert not runs.exists()  # nothing needed the class
    assert repository.override(model, {"parameters": {"threshold": 4}}).parameters == {"threshold": 4}
    assert runs.read_text() == "1"


def test_the_operator_setting_takes_a_comma_list_or_several_values() -> None:
    assert Settings(allow_load_overrides="url, handler").allow_load_overrides == ("url", "handler")
    assert Settings(allow_load_overrides=("url,handler", "extra")).allow_load_overrides == (
        "url",
        "handler",
        "extra",
    )
    assert Settings().allow_load_overrides == ()
    with pytest.raises(BadSetting, match="allow_load_overrides must be names"):
        Settings(allow_load_overrides=3)  # type: ignore[arg-type]


def test_the_policy_holds_on_the_settings_as_parsed() -> None:
    """Issue 30: whatever spelling a request uses, what changed in the parsed settings is
    what is checked; no container value is converted from another JSON type."""
    base = settings()
    for config in (
        {"parameters": [["uri", "/b"]]},
        {"parameters": (("uri", "/b"),)},
        {"parameters": "uri=/b"},
        {"sequence": [["max_queue", 1]]},
    ):
        with pytest.raises(SettingsError, match="expected a JSON object, not"):
            override_settings(base, config, declared=frozenset({"threshold"}))
    # the same value as the model's own is no change; the same value of another type is one
    assert override_settings(base, {"parameters": {"uri": "/a"}}).parameters == base.parameters
    with pytest.raises(LoadOverrideRefused):
        override_settings(settings(parameters={"uri": 1}), {"parameters": {"uri": True}})


def test_model_settings_type_check_every_value() -> None:
    """A model-settings.json value of the wrong JSON type is refused, never converted (no
    file of the project relied on a conversion; MLServer refuses them too)."""
    from actorserve.settings import model_settings_from_dict

    good = {"name": "m", "implementation": "x.Y"}
    for bad, message in (
        ({"parameters": [["uri", "/b"]]}, "'parameters' must be a JSON object, not an array"),
        ({"parameters": "x"}, "'parameters' must be a JSON object, not a string"),
        ({"sequence": [["max_queue", 1]]}, "'sequence' must be a JSON object, not an array"),
        ({"sequence": {"max_queue": "1"}}, "'sequence.max_queue' must be an integer, not a string"),
        ({"sequence": {"evict_idle": 1}}, "'sequence.evict_idle' must be true or false"),
        ({"workers": "2"}, "'workers' must be an integer, not a string"),
        ({"max_batch_size": True}, "'max_batch_size' must be an integer, not a boolean"),
        ({"max_batch_time": "0.1"}, "'max_batch_time' must be a number, not a string"),
        ({"versions": "12"}, "'versions' must be a list of version names"),
        ({"text_generation": [["usage", True]]}, "'text_generation' must be a JSON object"),
        ({"implementation": ["x.Y"]}, "'implementation' must be a string"),
    ):
        with pytest.raises(SettingsError, match=re.escape(message)):
            model_settings_from_dict({**good, **bad})
    parsed = model_settings_from_dict({**good, "max_batch_time": 1, "parameters": {"version": 2}})
    assert (parsed.max_batch_time, parsed.version) == (1.0, "2")
