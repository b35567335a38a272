"""``python -m actorserve``: options made from Settings, errors that name the flag or the
variable, docs/cli.md in step with --help, and a port in use failing before any model loads."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import click
import pytest
from click.testing import CliRunner, Result

import actorserve.__main__ as cli_module
from actorserve.__main__ import cli, main
from actorserve.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "cli.md").read_text()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ACTORSERVE_* variable of the machine running the tests leaks into them."""
    for key in list(os.environ):
        if key.startswith("ACTORSERVE_"):
            monkeypatch.delenv(key)


def invoke(*args: str, **env: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, prog_name="python -m actorserve")


def help_text() -> str:
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    return result.output


def options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))


def variables(text: str) -> set[str]:
    return set(re.findall(r"\bACTORSERVE_[A-Z_]*[A-Z]", text))


def test_help_has_one_option_and_one_variable_per_setting() -> None:
    text = help_text()
    for field in attrs.fields(Settings):
        if field.name not in ("models", "token", "inference_token"):  # tokens: variables only, never flags
            assert "--" + field.name.replace("_", "-") + " " in text
        if field.name != "models":
            assert "ACTORSERVE_" + field.name.upper() in text
    assert "ACTORSERVE_GRPC_STREAM_MAX_INFLIGHT" in text
    assert "--api-workers" in text and "ACTORSERVE_API_WORKERS" in text
    assert (
        "front processes serving REST and gRPC beside one engine process ('0': everything in one process; see"
        in " ".join(text.split())
    )
    # every option but --version/--help has exactly one variable
    # + MODEL_FOLDERS, TOKEN and INFERENCE_TOKEN
    assert len(variables(text)) == len(options(text) - {"--version", "--help"}) + 3


def test_docs_list_every_option_and_variable_of_help_and_nothing_else() -> None:
    text = help_text()
    assert options(DOCS) == options(text)
    assert variables(DOCS) - {"ACTORSERVE_"} == variables(text)


def test_docs_rows_give_each_option_its_variable_and_default() -> None:
    rows = [line for line in DOCS.splitlines() if line.startswith("| `--")]
    params = [p for p in cli.params if isinstance(p, click.Option) and p.name and p.expose_value]
    assert params
    for param in params:
        flag = param.opts[0]
        (row,) = [r for r in rows if r.startswith(f"| `{flag}` |")]
        assert f"`ACTORSERVE_{param.name.upper()}`" in row
        default = "none" if param.default is None or param.multiple else f"`{param.default}`"
        assert default in row, (flag, row)


def test_a_bad_environment_value_names_the_variable() -> None:
    result = invoke(ACTORSERVE_HTTP_PORT="abc")
    assert result.exit_code == 2
    assert (
        "Error: Invalid value for ACTORSERVE_HTTP_PORT: 'abc' is not a port number or 'off'" in result.stderr
    )
    result = invoke(ACTORSERVE_GRACE_PERIOD="-1")  # checked by Settings, named by the CLI
    assert result.exit_code == 2
    assert "Error: Invalid value for ACTORSERVE_GRACE_PERIOD: must be >= 0" in result.stderr
    result = invoke(ACTORSERVE_WORKERS="0")
    assert (
        result.exit_code,
        "Error: Invalid value for ACTORSERVE_WORKERS: must be >= 1" in result.stderr,
    ) == (2, True)


def test_a_bad_flag_names_the_flag_even_when_its_variable_is_set() -> None:
    result = invoke("--http-port", "abc", ACTORSERVE_HTTP_PORT="8000")
    assert result.exit_code == 2
    assert "Error: Invalid value for '--http-port': 'abc' is not a port number or 'off'" in result.stderr
    result = invoke("--grpc-port", "70000")
    assert (
        result.exit_code,
        "Error: Invalid value for '--grpc-port': must be 0-65535 or off" in result.stderr,
    ) == (
        2,
        True,
    )
    result = invoke("--grpc-stream-dialect", "kserve")
    assert result.exit_code == 2 and "Invalid value for '--grpc-stream-dialect'" in result.stderr


def test_api_workers_must_not_be_negative() -> None:
    result = invoke("--api-workers", "-1")
    assert result.exit_code == 2
    assert "Error: Invalid value for '--api-workers': must be >= 0" in result.stderr
    result = invoke(ACTORSERVE_API_WORKERS="-1")
    assert result.exit_code == 2
    assert "Error: Invalid value for ACTORSERVE_API_WORKERS: must be >= 0" in result.stderr


def test_flags_and_variables_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Any] = []

    def fake_serve(settings: Settings, repository: Any, argv: list[str]) -> int:
        served.append((settings, repository))
        return 0

    monkeypatch.setattr(cli_module, "_serve_until_signal", fake_serve)
    result = invoke(
        "--host",
        "::1",
        "--grpc-stream-max-inflight",
        "8",
        "--api-workers",
        "3",
        "--workers",
        "2",
        ACTORSERVE_HTTP_PORT="0",
        ACTORSERVE_GRPC_PORT="off",
        ACTORSERVE_GRACE_PERIOD="2.5",
        ACTORSERVE_LOG_LEVEL="warning",
        ACTORSERVE_GRPC_STREAM_MAX_INFLIGHT="99",
    )
    assert result.exit_code == 0, result.output
    ((settings, repository),) = served
    assert (settings.host, settings.http_port, settings.grpc_port) == ("::1", 0, None)
    assert (settings.grace_period, settings.log_level) == (2.5, "WARNING")
    assert (settings.grpc_stream_max_inflight, settings.api_workers) == (8, 3)  # the flag wins
    assert repository.workers == 2 and {m.workers for m in settings.models} == {2}
    defaults = Settings()
    assert (settings.max_body_bytes, settings.gzip_min_bytes) == (
        defaults.max_body_bytes,
        defaults.gzip_min_bytes,
    )


def test_model_folders_come_from_the_variable_separated_by_pathsep(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served: list[Any] = []

    def fake_serve(settings: Settings, repository: Any, argv: list[str]) -> int:
        served.append(repository)
        return 0

    monkeypatch.setattr(cli_module, "_serve_until_signal", fake_serve)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-settings.json").write_text(
            f'{{"name": "{name}", "implementation": "actorserve.models.identity.IdentityModel"}}'
        )
    folders = os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b"), ""])
    result = invoke(ACTORSERVE_MODEL_FOLDERS=folders)
    assert result.exit_code == 0, result.output
    assert served[0].folders == (tmp_path / "a", tmp_path / "b")
    result = invoke("--model-repository", str(tmp_path / "a"), str(tmp_path / "b"))  # Triton's flag too
    assert (result.exit_code, served[1].folders) == (0, (tmp_path / "a", tmp_path / "b"))
    result = invoke(ACTORSERVE_MODEL_REPOSITORY=folders)
    assert (result.exit_code, served[2].folders) == (0, (tmp_path / "a", tmp_path / "b"))


def test_cors_origins_repeat_or_come_as_a_list_and_a_watched_broken_folder_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served: list[Settings] = []

    def fake_serve(settings: Settings, repository: Any, argv: list[str]) -> int:
        served.append(settings)
        return 0

    monkeypatch.setattr(cli_module, "_serve_until_signal", fake_serve)
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "model-settings.json").write_text(
        '{"implementation": "actorserve.models.identity.IdentityModel"}'
    )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model-settings.json").write_text("{not json")
    result = invoke(
        "--cors-allow-origin",
        "https://a.example,https://b.example/",
        "--cors-allow-origin",
        "http://localhost:3000",
        "--poll-repository",
        "5",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    (settings,) = served
    assert settings.cors_allow_origin == ("https://a.example", "https://b.example", "http://localhost:3000")
    assert (settings.poll_repository, [m.name for m in settings.models]) == (5.0, ["good"])
    assert invoke(str(tmp_path)).exit_code == 2  # not watched: a broken folder stops the start
    refused = invoke("--cors-allow-origin", "app.example")
    assert refused.exit_code == 2
    assert (
        "Invalid value for '--cors-allow-origin': must be origins like https://app.example.com (or *)"
        in refused.stderr
    )
    assert invoke(ACTORSERVE_CORS_ALLOW_ORIGIN="https://a.example https://b.example").exit_code == 0
    assert served[-1].cors_allow_origin == ("https://a.example", "https://b.example")


def test_version_and_main_return_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from actorserve import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"actorserve {__version__}\n"
    assert main(["--api-workers", "-1"]) == 2
    assert "Error: Invalid value for '--api-workers': must be >= 0" in capsys.readouterr().err


def test_a_variable_for_version_does_not_stop_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module, "_serve_until_signal", lambda settings, repository, argv: 0)
    result = invoke(ACTORSERVE_VERSION="1")
    assert result.exit_code == 0 and result.output == ""


MARKER_MODEL = """\
from pathlib import Path

Path(__file__).with_name("imported").touch()  # proof that the model was loaded


class Marker:
    pass
"""


@pytest.mark.parametrize("transport", ["REST", "gRPC"])
def test_a_port_in_use_names_it_and_exits_1_before_any_model_loads(tmp_path: Path, transport: str) -> None:
    folder = tmp_path / "marker"
    folder.mkdir()
    (folder / "marker.py").write_text(MARKER_MODEL)
    (folder / "model-settings.json").write_text('{"name": "marker", "implementation": "marker.Marker"}')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORSERVE_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = (
            ["--http-port", port, "--grpc-port", "0"]
            if transport == "REST"
            else ["--http-port", "0", "--grpc-port", port]
        )
        result = subprocess.run(
            [sys.executable, "-m", "actorserve", str(tmp_path), *ports],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=ROOT,
        )
    assert result.returncode == 1, result.stderr
    error = f"actorserve: error: cannot listen on 127.0.0.1:{port} ({transport}): address already in use"
    assert [line for line in result.stderr.splitlines() if "error" in line] == [error]
    assert "loaded model" not in result.stderr
    assert not (folder / "imported").exists()
