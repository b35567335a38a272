"""One text per setting: each Settings field carries its help, the CLI's option shows
exactly that help, and docs/cli.md's option table is the one made from the CLI
(actorserve/clidocs.py), so the docs list every option and no option that does not exist."""

from __future__ import annotations

import attrs
import click

from actorserve.__main__ import cli
from actorserve.clidocs import DOCS, in_docs, main, markdown, table
from actorserve.settings import HELP, Settings


def test_every_setting_carries_its_help() -> None:
    missing = [field.name for field in attrs.fields(Settings) if not field.metadata.get(HELP, "").strip()]
    assert missing == []


def test_each_option_made_from_a_setting_shows_the_settings_own_help() -> None:
    options = {p.name: p for p in cli.params if isinstance(p, click.Option)}
    fields = [
        field for field in attrs.fields(Settings) if field.name not in ("models", "token", "inference_token")
    ]
    assert fields
    for field in fields:
        assert options[field.name].help == field.metadata[HELP], field.name


def test_the_docs_option_table_is_the_one_made_from_the_cli() -> None:
    assert in_docs(DOCS.read_text()) == table(), (
        "docs/cli.md is out of date: run python -m actorserve.clidocs"
    )
    assert main(["--check"]) == 0


def test_every_option_has_one_row_and_every_row_an_option() -> None:
    context = click.Context(cli, **cli.context_settings)
    flags = {opt for p in cli.params if isinstance(p, click.Option) for opt in p.opts}
    help_option = cli.get_help_option(context)
    assert help_option is not None
    flags |= set(help_option.opts)
    rows = [line for line in in_docs(DOCS.read_text()).splitlines() if line.startswith("| `-")]
    listed = {flag.strip("`") for row in rows for flag in row.split(" | ")[0].strip("| ").split(", ")}
    assert listed == flags
    assert len(rows) == len(flags) - 1  # -h and --help share a row


def test_each_settings_help_appears_in_its_row() -> None:
    text = in_docs(DOCS.read_text())
    for field in attrs.fields(Settings):
        if field.name in ("models", "token", "inference_token"):
            continue
        (row,) = [r for r in text.splitlines() if r.startswith(f"| `--{field.name.replace('_', '-')}` |")]
        assert row.endswith(f"| {markdown(field.metadata[HELP])} |")


def test_api_workers_says_what_the_code_does() -> None:
    """0 is the one-process shape (server.serve in this process), not 1."""
    help_text = attrs.fields_dict(Settings)["api_workers"].metadata[HELP]
    assert "'0': everything in one process" in help_text


def test_markdown_quotes_values_flags_and_variables_and_links_docs() -> None:
    assert markdown("'off' turns it off") == "`off` turns it off"
    assert markdown("TorchServe's own and the server's") == "TorchServe's own and the server's"
    assert markdown("needs --auth-inference") == "needs `--auth-inference`"
    assert markdown("or ACTORSERVE_TOKEN") == "or `ACTORSERVE_TOKEN`"
    assert markdown("see docs/deploy.md#drain") == "see [deploy.md](deploy.md#drain)"
    assert markdown("a | b") == "a \\| b"
