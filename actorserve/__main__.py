"""``python -m actorserve [MODELS_DIR ...]``: serve models over REST (and gRPC).

The options are made from :class:`~actorserve.settings.Settings` itself: one option per
field (plus ``--workers``), each with exactly one ``ACTORSERVE_*`` variable (click's
``auto_envvar_prefix``), and ``Settings`` checks every value. A flag wins over its variable.
SIGINT / SIGTERM shut down gracefully (a second one stops at once). Exit codes: 0 after a
clean shutdown, 2 for bad settings or arguments, 1 when the server cannot start.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import attrs
import click
import trio
from click.core import ParameterSource

from .engine.repository import ModelRepository
from .errors import ModelFailed
from .models import builtin_settings as builtin_models
from .server import clock, processes
from .server.clitypes import Port, metavar_of
from .server.composition import Server, serve
from .server.listeners import raise_open_file_limit
from .server.logformat import configure_logging
from .server.tokens import take_tokens
from .settings import (
    GRPC_STREAM_DIALECTS,
    HELP,
    HTTP_PARSERS,
    LOG_FORMATS,
    LOG_LEVELS,
    MODEL_SETTINGS_FILE,
    BadSetting,
    ModelSettings,
    Settings,
    SettingsError,
)
from .version import __version__

log = logging.getLogger("actorserve")

PROG = "python -m actorserve"
ENV_PREFIX = "ACTORSERVE"
#: the bearer token, from the environment only (a flag would show in ``ps``)
TOKEN_VARIABLE = f"{ENV_PREFIX}_TOKEN"
#: Settings fields without an option of their own
_NO_OPTION = ("models", "token", "inference_token")
MODEL_FOLDERS_VARIABLE = f"{ENV_PREFIX}_MODEL_FOLDERS"

F = TypeVar("F", bound=Callable[..., Any])

#: the type of the option made from each field of Settings (all but ``models`` and
#: ``token``); a field missing here fails at import, so a new setting cannot lack its
#: option. Its help is the field's own (``metadata[HELP]`` in settings.py).
_SETTINGS_OPTIONS: dict[str, click.ParamType[Any]] = {
    "host": click.STRING,
    "http_port": Port(),
    "grpc_port": Port(),
    "ts_inference_grpc_port": Port(),
    "ts_management_grpc_port": Port(),
    "ts_management_http_port": Port(),
    "max_body_bytes": click.INT,
    "read_timeout": click.FLOAT,
    "grace_period": click.FLOAT,
    "drain_timeout": click.FLOAT,
    "gzip_min_bytes": click.INT,
    "keep_alive_timeout": click.FLOAT,
    "grpc_idle_timeout": click.FLOAT,
    "backlog": click.INT,
    "http_parser": click.Choice(HTTP_PARSERS),
    "grpc_stream_dialect": click.Choice(GRPC_STREAM_DIALECTS),
    "grpc_stream_max_inflight": click.INT,
    "log_level": click.Choice(LOG_LEVELS, case_sensitive=False),
    "api_workers": click.INT,
    "cors_allow_origin": click.STRING,
    "poll_repository": click.FLOAT,
    "log_format": click.Choice(LOG_FORMATS),
    "access_log": click.BOOL,
    "otel": click.BOOL,
    "no_auth": click.BOOL,
    "auth_inference": click.BOOL,
    "auth_metrics": click.BOOL,
    "allow_load_overrides": click.STRING,
    "bind_sequences_to_token": click.BOOL,
    "max_archive_bytes": click.INT,
    "max_archive_members": click.INT,
    "replica_id": click.STRING,
    "sequence_headers": click.STRING,
    "token_file": click.Path(dir_okay=False),
}


#: the default shown for a field whose None means something other than "off"
_SHOWN_DEFAULTS: dict[str, str] = {"replica_id": "the host name"}


class _Option(click.Option):
    """An option whose errors name where the bad value came from: the flag, or its
    ``ACTORSERVE_*`` variable."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        if (
            ctx is not None
            and self.name
            and ctx.get_parameter_source(self.name) is ParameterSource.ENVIRONMENT
        ):
            return self.variable(ctx)
        return " / ".join(f"'{opt}'" for opt in self.opts)

    def variable(self, ctx: click.Context) -> str:
        if isinstance(self.envvar, str):
            return self.envvar
        return f"{ctx.auto_envvar_prefix or ENV_PREFIX}_{(self.name or '').upper()}"


def _settings_options(command: F) -> F:
    """Decorate ``command`` with one option per :class:`Settings` field, in field order."""
    fields = [field for field in attrs.fields(Settings) if field.name not in _NO_OPTION]
    for field in reversed(fields):
        kind = _SETTINGS_OPTIONS[field.name]
        default = field.default
        flag = kind is click.BOOL
        multiple = isinstance(default, tuple)  # a list setting: the option repeats
        command = click.option(
            "--" + field.name.replace("_", "-"),
            field.name,
            cls=_Option,
            type=kind,
            is_flag=flag,
            default=default,
            multiple=multiple,
            show_default=_SHOWN_DEFAULTS.get(field.name)
            or (False if flag else "off" if default is None else "none" if multiple else True),
            metavar=None if flag else metavar_of(kind),
            show_envvar=True,
            help=field.metadata[HELP],
        )(command)
    return command


def _check_workers(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise click.BadParameter("must be >= 1", ctx=ctx, param=param)
    return value


_HELP = f"""Serve models over the Open Inference Protocol (KServe V2): REST and gRPC.

Each MODELS_DIR (or each folder in {MODEL_FOLDERS_VARIABLE}, separated by '{os.pathsep}') is
searched, any depth, for model-settings.json files; without any, the built-in models
(identity, streamer, accumulator, text, ts_stateful) are served.

Every option can also be set by the ACTORSERVE_* variable shown beside it; the flag wins.

SIGINT (Ctrl-C) or SIGTERM stops accepting connections, gives in-flight requests the
grace period to finish, then cancels the rest; a second signal stops at once. Exit codes:
0 after a clean shutdown, 1 when the server cannot start, 2 for bad settings or arguments.
"""


@click.command(
    help=_HELP,
    context_settings={
        "auto_envvar_prefix": ENV_PREFIX,
        "show_default": True,
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
    },
)
@click.argument(
    "models_dirs",
    nargs=-1,
    metavar="[MODELS_DIR]...",
    type=click.Path(),
    envvar=MODEL_FOLDERS_VARIABLE,
)
@_settings_options
@click.option(
    "--model-repository",
    "model_repository",
    cls=_Option,
    type=click.Path(),
    multiple=True,
    default=(),
    show_default="none",
    show_envvar=True,
    help="a model folder, as Triton's flag names it (repeatable; the same as a MODELS_DIR)",
)
@click.option(
    "--workers",
    cls=_Option,
    type=click.INT,
    default=None,
    show_default="each model's workers",
    callback=_check_workers,
    show_envvar=True,
    help="replicas of every model (overrides each model's workers)",
)
# no variable: ACTORSERVE_VERSION must not turn the server into a version printer
@click.version_option(
    __version__,
    "--version",
    prog_name="actorserve",
    message="%(prog)s %(version)s",
    allow_from_autoenv=False,
    help="print 'actorserve VERSION' and exit",
)
@click.pass_context
def cli(
    ctx: click.Context,
    /,
    models_dirs: tuple[str, ...],
    model_repository: tuple[str, ...],
    workers: int | None,
    **values: Any,
) -> None:
    """Check the settings, then serve until a signal; exits with the code documented above."""
    try:
        token, inference_token = take_tokens(
            TOKEN_VARIABLE, f"{ENV_PREFIX}_INFERENCE_TOKEN", f"{TOKEN_VARIABLE}_FILE"
        )
        settings = Settings(**values, token=token, inference_token=inference_token)
    except BadSetting as exc:
        param = next((p for p in ctx.command.params if p.name == exc.field), None)
        raise click.BadParameter(exc.reason, ctx=ctx, param=param) from None
    configure_logging(settings.log_level, settings.log_format)
    folders = tuple(Path(folder) for folder in (*model_repository, *models_dirs) if folder)
    repository = ModelRepository(folders, workers).with_archive_limits(settings)
    role = processes.role()
    #: this process loads the models (one process, or the engine of the multi-process server)
    loads = role == "engine" or (role is None and settings.api_workers == 0)
    try:
        if role == "front":
            # a front serves what the engine holds and never reads the folders: a file
            # broken by the time a front restarts must not stop the server, and a front
            # has no use for an extracted archive
            models: list[ModelSettings] = []
        elif not folders:
            models = repository.apply_overrides(builtin_models())
        elif settings.poll_repository > 0:  # watched: a broken folder waits for its fix
            missing = [folder for folder in folders if not folder.is_dir()]
            if missing:
                raise SettingsError(f"{missing[0]}: not a folder")
            models, problems = repository.scan()
            for problem in problems.values():
                log.warning("not loaded (loads once fixed): %s", problem)
        else:  # the parent only checks the files (its engine extracts the archives, once)
            models = repository.discover(archives=loads)
    except SettingsError as exc:
        _error(str(exc))
        ctx.exit(2)
    if loads:
        for folder in repository.empty_folders():
            log.info("model folder %s is empty: no model is served until one is loaded or registered", folder)
    ctx.exit(_serve_until_signal(settings.with_models(models), repository, ctx.obj or sys.argv[1:]))


def _error(message: str) -> None:
    print(f"actorserve: error: {message}", file=sys.stderr)


def _serve_until_signal(settings: Settings, repository: ModelRepository, argv: Sequence[str]) -> int:
    """Run the server (one process, or the parent / a child of the multi-process server:
    see :mod:`actorserve.server.processes`); the exit code, after a one-line message for a
    startup error."""
    role = processes.role()
    raise_open_file_limit()  # a surge of connections can pass a soft limit of 1,024
    try:
        # the processes that run models wait on precise timers (server/clock.py): a
        # paced stream's every token and its first one end on their deadline
        if role == "engine":
            clock.run(processes.run_engine_child, settings, repository)
        elif role == "front":
            trio.run(processes.run_front_child, settings)
        elif settings.api_workers > 0:
            return trio.run(processes.run_parent, settings, argv)
        else:
            clock.run(_run, settings, repository)
    except BaseException as error:
        problems = _problems(error)
        for problem in problems:
            if isinstance(problem, SettingsError):
                _error(_with_file(str(problem), settings))
                return 2
            if isinstance(problem, ModelFailed):
                _error(_with_file(problem.message, settings))
                return 1
        for problem in problems:
            if isinstance(problem, OSError):  # ListenError: "cannot listen on host:port (REST): ..."
                _error(str(problem))
                return 1
        if all(isinstance(p, KeyboardInterrupt) for p in problems):
            return 0
        raise
    return 0


async def _run(settings: Settings, repository: ModelRepository) -> None:
    """One process: serve until a signal (watched from before the models load)."""
    served: list[Server] = []  # the server, once it serves
    async with trio.open_nursery() as nursery:

        async def run_server(*, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
            await serve(settings, repository=repository, freeze_heap=True, task_status=task_status)
            nursery.cancel_scope.cancel()  # serve() is done: stop watching for signals

        await nursery.start(_watch_signals, served, nursery.cancel_scope)
        # serve() logs "REST listening on ... (playground: ...)"; gRPC logs its own line
        served.append(await nursery.start(run_server))
    if not served:
        log.info("actorserve stopped")  # as serve() logs after a graceful stop


async def _watch_signals(
    served: list[Server], scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
) -> None:
    """SIGINT / SIGTERM: the first shuts the server down gracefully (before it serves: cancels
    ``scope``, the start-up, to exit 0); a second stops at once, as does any once this has
    returned (the default action: a load stuck in a thread cannot hold it up)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if not served:
                log.info("%s: shutting down gracefully (during start-up: the models stop loading)", name)
                scope.cancel()
                return
            if served[0].stopping:
                log.warning("second %s: stopping now", name)
                scope.cancel()
                return
            log.info("%s: shutting down gracefully", name)
            served[0].shutdown()


def _problems(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for sub in error.exceptions for leaf in _problems(sub)]
    return [error]


def _with_file(message: str, settings: Settings) -> str:
    """Prefix a model's error with its settings file, unless it already names one."""
    match = re.search(r"model '([^']+)'", message)
    if match is None:
        return message
    for model in settings.models:
        if model.name == match[1] and model.folder is not None:
            path = str(model.folder / MODEL_SETTINGS_FILE)
            return message if path in message else f"{path}: {message}"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``) and the process's
    environment; return the exit code instead of exiting."""
    try:
        args = list(argv) if argv is not None else sys.argv[1:]
        # obj: the arguments again, for the children of the multi-process server
        cli.main(args=args, prog_name=_prog_name(), standalone_mode=True, obj=args)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _prog_name() -> str:
    """``python -m actorserve``, or the name of the console script that runs ``main``."""
    name = Path(sys.argv[0]).name if sys.argv else ""
    return PROG if name in ("", "-c", "__main__.py") else name


def run() -> NoReturn:
    """:func:`main` as a process of its own (``python -m actorserve``, the ``actorserve``
    script, each child of the multi-process server): exit with its code once the
    atexit handlers ran (logging is flushed), without the interpreter's teardown of every
    module. After a served run that teardown (torch, ~200,000 objects) took 0.5-1 s of an
    idle server's shutdown, more than the whole drain."""
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)  # a thread that must finish first: the interpreter joins it
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
