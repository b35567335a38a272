"""Which version answers a request that names none: OIP's rule (newest, unless chosen)
for actorserve models, TorchServe's (the first loaded stays, unless chosen) for models
from TorchServe archives."""

from __future__ import annotations

from actorserve.engine.default_version import DefaultVersions
from actorserve.settings import ModelSettings
from actorserve.torchserve_envelope import PLATFORM, SEQUENCE_PLATFORM


def settings(version: str, platform: str = "") -> ModelSettings:
    return ModelSettings(
        name="m", implementation="actorserve.models.identity.Identity", version=version, platform=platform
    )


def load(defaults: DefaultVersions, loaded: list[str], version: str, platform: str = "") -> str:
    """Load ``version`` beside ``loaded`` as the engine does; the default afterwards."""
    before = defaults.of("m", loaded) if loaded else None
    loaded.append(version)
    defaults.loaded(settings(version, platform), before)
    return defaults.of("m", loaded)


def test_an_actorserve_model_serves_its_newest_version_unless_one_is_chosen() -> None:
    defaults, loaded = DefaultVersions(), []
    assert [load(defaults, loaded, v) for v in ("1", "3", "2")] == ["1", "3", "3"]
    defaults.choose("m", "1")
    assert load(defaults, loaded, "4") == "1"


def test_a_torchserve_model_keeps_its_first_version_until_one_is_chosen() -> None:
    for platform in (PLATFORM, SEQUENCE_PLATFORM):
        defaults, loaded = DefaultVersions(), []
        assert [load(defaults, loaded, v, platform) for v in ("2.0", "3.0", "1.0")] == ["2.0", "2.0", "2.0"]
        defaults.choose("m", "3.0")
        assert load(defaults, loaded, "4.0", platform) == "3.0"


def test_an_unloaded_default_is_forgotten() -> None:
    defaults, loaded = DefaultVersions(), []
    for version in ("1.0", "2.0", "3.0"):
        load(defaults, loaded, version, PLATFORM)
    loaded.remove("1.0")
    defaults.unloaded("m", "1.0", loaded)
    assert defaults.of("m", loaded) == "3.0"  # the newest remaining, not a version that is gone
    defaults.choose("m", "2.0")
    loaded.remove("3.0")
    defaults.unloaded("m", "3.0", loaded)  # not the default: it stays
    assert defaults.of("m", loaded) == "2.0"
    loaded.clear()
    defaults.unloaded("m", "2.0", loaded)
    assert load(defaults, loaded, "5.0", PLATFORM) == "5.0"  # the model's first version again
