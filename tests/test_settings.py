"""model-settings.json loading and server settings from the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actorserve.settings import Settings, SettingsError, discover_models, load_model_settings


def write(folder: Path, data: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-settings.json"
    path.write_text(json.dumps(data))
    return path


def test_mlserver_shape_with_sequence_block(tmp_path: Path) -> None:
    write(tmp_path / "m", {
        "name": "m", "implementation": "actorserve.models.identity.IdentityModel",
        "parameters": {"version": "3", "extra": 1}, "max_batch_size": 8, "max_batch_time": 0.01,
        "workers": 2, "sequence": {"idle_timeout_ms": 500, "max_queue": 4, "evict_idle": True},
    })
    (settings,) = discover_models(tmp_path)
    assert settings.version == "3" and settings.workers == 2 and settings.max_batch_size == 8
    assert settings.sequence.idle_timeout_ms == 500 and settings.sequence.evict_idle
    assert settings.folder == tmp_path / "m"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "invalid JSON"),
        ({"name": "m"}, "missing 'implementation'"),
        ({"name": "m", "implementation": "x.Y", "sequence": {"bogus": 1}}, "bad 'sequence' block"),
        ({"name": "m", "implementation": "x.Y", "wat": 1}, "unknown setting"),
        ({"name": "m", "implementation": "x.Y", "workers": 0}, "workers must be >= 1"),
    ],
)
def test_bad_settings_name_the_file(tmp_path: Path, data: object, message: str) -> None:
    path = tmp_path / "model-settings.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(SettingsError, match=message) as info:
        load_model_settings(path)
    assert str(path) in str(info.value)


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"no model-settings\.json"):
        discover_models(tmp_path)


def test_env_settings() -> None:
    env = {"ACTORSERVE_HTTP_PORT": "0", "ACTORSERVE_GRPC_PORT": "off", "ACTORSERVE_GRACE_PERIOD": "2.5"}
    settings = Settings.from_env(env, host="::1")
    assert settings.http_port == 0 and settings.grpc_port is None
    assert settings.grace_period == 2.5 and settings.host == "::1"


async def test_loading_a_broken_model_is_bad_input_on_every_transport() -> None:
    from grpclib.const import Status

    import actorserve
    from actorserve.settings import ModelSettings
    from actorserve.transport.errors import grpc_status, http_status

    async with actorserve.open_engine([]) as engine:
        with pytest.raises(actorserve.BadInput, match=r"cannot import 'no_such\.Model'") as info:
            await engine.load(ModelSettings(name="m", implementation="no_such.Model"))
    assert http_status(info.value) == 400 and Status(grpc_status(info.value)) == Status.INVALID_ARGUMENT
