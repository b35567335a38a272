"""model-settings.json loading and the checks of the server-wide settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from actorserve.settings import BadSetting, Settings, SettingsError, discover_models, load_model_settings


def write(folder: Path, data: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-settings.json"
    path.write_text(json.dumps(data))
    return path


def test_mlserver_shape_with_sequence_block(tmp_path: Path) -> None:
    write(
        tmp_path / "m",
        {
            "name": "m",
            "implementation": "actorserve.models.identity.IdentityModel",
            "parameters": {"version": "3", "extra": 1},
            "max_batch_size": 8,
            "max_batch_time": 0.01,
            "workers": 2,
            "sequence": {"idle_timeout_ms": 500, "max_queue": 4, "evict_idle": True},
        },
    )
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


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"http_port": 65536}, "http_port must be 0-65535 or off"),
        ({"grpc_port": -1}, "grpc_port must be 0-65535 or off"),
        ({"http_port": "8080"}, "http_port must be 0-65535 or off"),
        ({"grace_period": -0.5}, "grace_period must be >= 0"),
        ({"max_body_bytes": 0}, "max_body_bytes must be >= 1"),
        ({"max_body_bytes": "64"}, "max_body_bytes must be an integer >= 1"),
        ({"gzip_min_bytes": -1}, "gzip_min_bytes must be >= 0"),
        ({"grpc_stream_max_inflight": 0}, "grpc_stream_max_inflight must be >= 1"),
        ({"api_workers": -1}, "api_workers must be >= 0"),
        ({"grpc_stream_dialect": "kserve"}, "grpc_stream_dialect must be 'triton' or 'mlserver'"),
        ({"log_level": "loud"}, "log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ({"host": ""}, "host must be a host name or IP address"),
    ],
)
def test_server_settings_check_every_value(values: dict[str, Any], message: str) -> None:
    field = next(iter(values))
    with pytest.raises(BadSetting) as info:
        Settings(**values)
    assert (str(info.value), info.value.field) == (message, field)
    assert info.value.reason == message.removeprefix(f"{field} ")
    with pytest.raises(BadSetting):  # attrs.evolve checks too
        attrs.evolve(Settings(), **values)


def test_server_settings_defaults_and_edges() -> None:
    settings = Settings(http_port=0, grpc_port=None, grace_period=0, gzip_min_bytes=0, log_level="debug")
    assert (settings.http_port, settings.grpc_port, settings.grace_period) == (0, None, 0)
    assert settings.log_level == "DEBUG" and settings.api_workers == 2
    assert Settings(http_port=65535).http_port == 65535


async def test_loading_a_broken_model_is_bad_input_on_every_transport() -> None:
    from grpclib.const import Status

    import actorserve
    from actorserve.settings import ModelSettings
    from actorserve.transport.errors import grpc_status, http_status

    async with actorserve.open_engine([]) as engine:
        with pytest.raises(actorserve.BadInput, match=r"cannot import 'no_such\.Model'") as info:
            await engine.load(ModelSettings(name="m", implementation="no_such.Model"))
    assert http_status(info.value) == 400 and Status(grpc_status(info.value)) == Status.INVALID_ARGUMENT


def test_warmup_requests_are_checked_when_the_settings_are_read() -> None:
    from actorserve.modelsettings import model_settings_from_dict
    from actorserve.warmup import MAX_WARMUP

    base = {"name": "m", "implementation": "x.Y"}
    good = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}], "parameters": {"p": 1}}
    settings = model_settings_from_dict({**base, "warmup": [good, "Hello"]})
    assert settings.warmup == (good, "Hello")
    assert model_settings_from_dict(base).warmup == ()
    refused: list[tuple[object, str]] = [
        ("not a list", "settings: 'warmup' must be a list of requests (objects) or texts (strings)"),
        (
            (MAX_WARMUP + 1) * ["hi"],
            f"settings: 'warmup' lists {MAX_WARMUP + 1} requests; at most {MAX_WARMUP}",
        ),
        ([""], "settings: 'warmup[0]': a text of 1 to 16384 characters"),
        ([good, 3], "settings: 'warmup[1]' must be a request object or a text"),
        (
            [{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [1]}]}],
            "settings: 'warmup[0]': input 'x': shape [2] needs 2 elements, data has 1",
        ),
        ([{"parameters": {}}], "settings: 'warmup[0]': the request has no 'inputs'"),
    ]
    for value, message in refused:
        with pytest.raises(SettingsError) as error:
            model_settings_from_dict({**base, "warmup": value})
        assert error.value.message == message
