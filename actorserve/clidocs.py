"""docs/cli.md's option table, made from the command line itself: one row per option of
``python -m actorserve`` (its flag, its ``ACTORSERVE_*`` variable, its default, and its
help, which for a setting is the :class:`~actorserve.settings.Settings` field's own
``metadata[HELP]``), so the table cannot list an option that does not exist or say
something else than ``--help``.

``python -m actorserve.clidocs`` rewrites the table in docs/cli.md; ``--check`` only says
whether it is out of date (exit code 1). ``tests/test_cli_docs.py`` checks it too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from .__main__ import ENV_PREFIX, cli
from .server.clitypes import Port

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
BEGIN = "<!-- the option table: made by python -m actorserve.clidocs from the CLI; do not edit by hand -->"
END = "<!-- end of the option table -->"
HEADER = "| flag | environment variable | default | meaning |\n|---|---|---|---|"

#: click arguments show no help: what the table says of each
ARGUMENTS = {
    "models_dirs": ("built-ins", "model folders, each searched (any depth) for model-settings.json files")
}


def markdown(text: str) -> str:
    """Help text as a table cell: quoted values, flags and variables as code,
    ``docs/x.md#anchor`` as a link relative to docs/."""
    text = text.replace("|", "\\|")
    text = re.sub(r"docs/([\w-]+\.md)(#[\w-]+)?", r"[\1](\1\2)", text)
    text = re.sub(r"(?<![\w'])'([^']+?)'(?![\w'])", r"`\1`", text)
    text = re.sub(r"(?<![\w`-])(--[a-z][a-z-]*[a-z])", r"`\1`", text)
    return re.sub(rf"(?<![\w`])({ENV_PREFIX}_[A-Z_]*[A-Z])", r"`\1`", text)


def _variable(param: click.Parameter) -> str:
    if not param.expose_value or (isinstance(param, click.Option) and not param.allow_from_autoenv):
        return ""  # --version, --help
    names = param.envvar or f"{ENV_PREFIX}_{(param.name or '').upper()}"
    name = names if isinstance(names, str) else names[0]
    if not param.multiple and not (isinstance(param, click.Argument) and param.nargs == -1):
        return f"`{name}`"
    splitter = param.type.envvar_list_splitter
    return (
        f"`{name}` (separated by `{splitter}`)" if splitter else f"`{name}` (separated by spaces or commas)"
    )


def _default(param: click.Option) -> str:
    if not param.expose_value:  # --version, --help
        return ""
    if param.is_flag:
        return f"`{param.default}`"
    shown = param.show_default
    if param.default is None or param.multiple:
        if not isinstance(shown, str) or shown == "none":
            return "none"
        if shown == "off":  # a port: 'off' is the value that says so
            return "none (`off`)" if isinstance(param.type, Port) else "none"
        return f"none ({shown})"
    return f"`{param.default}`"


def rows(command: click.Command = cli) -> list[str]:
    """The table's rows: every parameter of ``command``, in its order, then ``--help``."""
    context = click.Context(command, **command.context_settings)
    params = [*command.params]
    help_option = command.get_help_option(context)
    if help_option is not None:
        params.append(help_option)
    out = []
    for param in params:
        if isinstance(param, click.Argument):
            default, meaning = ARGUMENTS[param.name or ""]
            flags = f"`{param.make_metavar(context).rstrip('.').strip('[]')} ...`"
        else:
            assert isinstance(param, click.Option)
            flags, default, meaning = (
                ", ".join(f"`{o}`" for o in param.opts),
                _default(param),
                param.help or "",
            )
        out.append(f"| {flags} | {_variable(param)} | {default} | {markdown(meaning)} |")
    return out


def table(command: click.Command = cli) -> str:
    """The whole block, markers included, as docs/cli.md holds it."""
    return "\n".join([BEGIN, HEADER, *rows(command), END])


def in_docs(text: str) -> str:
    """The block as ``text`` (docs/cli.md) holds it now; ValueError without one."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: Sequence[str] = ()) -> int:
    text = DOCS.read_text()
    current, wanted = in_docs(text), table()
    if current == wanted:
        return 0
    if "--check" in argv:
        print(f"{DOCS}: the option table is out of date: run python -m actorserve.clidocs", file=sys.stderr)
        return 1
    DOCS.write_text(text.replace(current, wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
