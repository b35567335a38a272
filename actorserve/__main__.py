"""``python -m actorserve [MODELS_DIR ...]``: serve models over REST (and gRPC).

Every flag has an ``ACTORSERVE_*`` environment variable; a flag wins over its variable.
SIGINT / SIGTERM shut down gracefully (a second one stops at once). Exit codes: 0 after a
clean shutdown, 2 for bad settings or arguments, 1 when the server cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from . import __version__
from .errors import ModelFailed
from .models import builtin_settings as builtin_models
from .repository import ModelRepository
from .server import Server, serve
from .settings import MODEL_SETTINGS_FILE, Settings, SettingsError

log = logging.getLogger("actorserve")

_EPILOG = f"""\
environment variables (a flag wins over its variable):
  ACTORSERVE_MODEL_FOLDERS   model folders, separated by '{os.pathsep}' (instead of MODELS_DIR)
  ACTORSERVE_HOST            --host
  ACTORSERVE_HTTP_PORT       --http-port ('off' turns REST off)
  ACTORSERVE_GRPC_PORT       --grpc-port ('off' turns gRPC off)
  ACTORSERVE_WORKERS         --workers
  ACTORSERVE_MAX_BODY_BYTES  --max-body-bytes
  ACTORSERVE_GRACE_PERIOD    --grace-period
  ACTORSERVE_GZIP_MIN_BYTES  smallest REST response that is gzipped (default 1024)
  ACTORSERVE_LOG_LEVEL       --log-level
  ACTORSERVE_GRPC_STREAM_DIALECT  --grpc-stream-dialect

shutdown: SIGINT (Ctrl-C) or SIGTERM stops accepting connections, gives in-flight
requests the grace period to finish, then cancels the rest; a second signal stops at once.
"""


def _port(text: str) -> int | None:
    if text.strip().lower() in ("off", "none", ""):
        return None
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or 'off', got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 0-65535")
    return port


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


_UNSET = object()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m actorserve",
        description="Serve models over the Open Inference Protocol (KServe V2): REST and gRPC.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "models_dirs",
        nargs="*",
        metavar="MODELS_DIR",
        type=Path,
        help="folder(s) searched for model-settings.json files (any depth); "
        "without one the built-in models (identity, streamer, accumulator, text) are served",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--http-port", type=_port, default=_UNSET, help="REST port (default 8080; 0 picks a free port; 'off')"
    )
    parser.add_argument(
        "--grpc-port", type=_port, default=_UNSET, help="gRPC port (default 8081; 0 picks a free port; 'off')"
    )
    parser.add_argument(
        "--workers", type=_positive_int, help="replicas of every model (overrides each model's 'workers')"
    )
    parser.add_argument(
        "--max-body-bytes", type=_positive_int, help="largest REST request body in bytes (default 64 MiB)"
    )
    parser.add_argument(
        "--grace-period",
        type=_non_negative_float,
        help="seconds in-flight requests get to finish on shutdown (default 10)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="log level (default INFO)",
    )
    parser.add_argument(
        "--grpc-stream-dialect",
        choices=("triton", "mlserver"),
        help="ModelStreamInfer flavour: 'triton' (ModelStreamInferResponse with error_message; "
        "default) or 'mlserver' (plain ModelInferResponse messages)",
    )
    parser.add_argument("--version", action="version", version=f"actorserve {__version__}")
    return parser


def _settings(args: argparse.Namespace, env: dict[str, str]) -> tuple[Settings, ModelRepository]:
    overrides = {
        "host": args.host,
        "max_body_bytes": args.max_body_bytes,
        "grace_period": args.grace_period,
        "log_level": args.log_level,
        "grpc_stream_dialect": args.grpc_stream_dialect,
    }
    try:
        settings = Settings.from_env(env, **overrides)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"bad ACTORSERVE_* environment variable: {exc}") from None
    if args.http_port is not _UNSET:
        settings = attrs.evolve(settings, http_port=args.http_port)
    if args.grpc_port is not _UNSET:
        settings = attrs.evolve(settings, grpc_port=args.grpc_port)
    workers = args.workers
    if workers is None and env.get("ACTORSERVE_WORKERS"):
        try:
            workers = _positive_int(env["ACTORSERVE_WORKERS"])
        except argparse.ArgumentTypeError as exc:
            raise SettingsError(f"ACTORSERVE_WORKERS: {exc}") from None
    folders: list[Path] = list(args.models_dirs)
    if not folders and env.get("ACTORSERVE_MODEL_FOLDERS"):
        folders = [Path(p) for p in env["ACTORSERVE_MODEL_FOLDERS"].split(os.pathsep) if p]
    repository = ModelRepository(tuple(folders), workers)
    models = repository.discover() if folders else repository.apply_overrides(builtin_models())
    return settings.with_models(models), repository


async def _run(settings: Settings, repository: ModelRepository) -> None:
    async with trio.open_nursery() as nursery:

        async def run_server(*, task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
            await serve(settings, repository=repository, task_status=task_status)
            nursery.cancel_scope.cancel()  # serve() is done: stop watching for signals

        server: Server = await nursery.start(run_server)
        if server.http_url is not None:
            log.info("REST listening on %s", server.http_url)
        # the gRPC transport logs its own "gRPC listening on host:port"
        nursery.start_soon(_watch_signals, server, nursery.cancel_scope)


async def _watch_signals(server: Server, scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if server.stopping:
                log.warning("second %s: stopping now", signal.Signals(signum).name)
                scope.cancel()
                return
            log.info("%s: shutting down gracefully", signal.Signals(signum).name)
            server.shutdown()


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
    args = build_parser().parse_args(argv)
    env = dict(os.environ)
    level = (args.log_level or env.get("ACTORSERVE_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # hypercorn announces "Running on ..." itself; the line above says it once, with the real port
    logging.getLogger("hypercorn.error").setLevel(max(logging.getLogger().level, logging.WARNING))
    try:
        settings, repository = _settings(args, env)
    except SettingsError as exc:
        print(f"actorserve: error: {exc}", file=sys.stderr)
        return 2
    if settings.grpc_stream_dialect not in ("triton", "mlserver"):
        print(f"actorserve: error: grpc_stream_dialect must be 'triton' or 'mlserver', got "
              f"{settings.grpc_stream_dialect!r}", file=sys.stderr)
        return 2
    try:
        trio.run(_run, settings, repository)
    except BaseException as error:
        problems = _problems(error)
        for problem in problems:
            if isinstance(problem, SettingsError):
                print(f"actorserve: error: {_with_file(str(problem), settings)}", file=sys.stderr)
                return 2
            if isinstance(problem, ModelFailed):
                print(f"actorserve: error: {_with_file(problem.message, settings)}", file=sys.stderr)
                return 1
        for problem in problems:
            if isinstance(problem, OSError):
                print(f"actorserve: error: cannot listen on {settings.host}: {problem.strerror or problem}",
                      file=sys.stderr)
                return 1
        if all(isinstance(p, KeyboardInterrupt) for p in problems):
            return 0
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
