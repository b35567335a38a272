"""Where the server's bearer tokens come from (the checks are in
:mod:`actorserve.transport.auth`).

Tokens, each with a scope (management or inference, see
:mod:`actorserve.transport.auth`): ``Settings.token`` (management; the CLI fills it from
``ACTORSERVE_TOKEN``, never from a flag, so it does not show in ``ps``),
``Settings.inference_token`` (inference; from ``ACTORSERVE_INFERENCE_TOKEN``) and the
lines of ``Settings.token_file`` (``<token> [management|inference]`` a line, management
when the scope is left out; blank lines and ``#`` comments skipped). When auth is on and neither is given,
:func:`generate_token_file` makes a random token, writes it to a file readable only by
this user (mode 0600, in a folder of mode 0700) and logs the file's path, never the
token. The server removes that file when it stops.

The file's path is stable for a fixed REST port (:func:`token_folder`):
``$XDG_RUNTIME_DIR/actorserve/<port>/token`` (or ``<tmp>/actorserve-<uid>/<port>/token``
without ``XDG_RUNTIME_DIR``), so a client's ``$(cat ...)`` works across restarts. Only
one server can hold a port, but a stale file (a killed server) may be there: it is
replaced. Where that folder is not private to this user (another owner, a symlink, open
to others), or the port is picked at start (0), a fresh temporary folder is used.

Model code runs in the server's processes, so the token does not stay in their
environment: the CLI takes ``ACTORSERVE_TOKEN``, ``ACTORSERVE_INFERENCE_TOKEN`` (and
``ACTORSERVE_TOKEN_FILE``) out of it as it reads them (:func:`take_tokens`), before any
model loads or child starts. The multi-process parent hands the tokens, each with its
scope, to its front processes in an unnamed file (mode 0600, already unlinked:
:func:`token_handoff`) whose descriptor each front inherits, reads and closes; the
engine process, which checks no token, gets none.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Final

import attrs

from ..settings import Settings, SettingsError
from ..tempdirs import is_temp_folder, make_temp_folder
from ..transport.auth import TOKEN_SCOPES, Scope

log = logging.getLogger("actorserve.server.tokens")

TOKEN_FILE_NAME = "token"
#: names the descriptor of :func:`token_handoff`'s file in a front process's environment
TOKENS_FD_VAR = "_ACTORSERVE_TOKENS_FD"


def auth_enabled(settings: Settings) -> bool:
    """Some route needs a token."""
    return not settings.no_auth or settings.auth_inference or settings.auth_metrics


#: a token with its scope, as :class:`~actorserve.transport.auth.Guard` takes them
ScopedToken = tuple[str, Scope]

_SCOPE_NAMES: Final = {scope.value: scope for scope in TOKEN_SCOPES}


def parse_token_line(line: str, where: str) -> ScopedToken | None:
    """One line of a token file: ``<token>`` (a management token) or ``<token> <scope>``
    (``management`` or ``inference``); None for a blank or ``#`` line;
    :class:`SettingsError` for anything else."""
    words = line.split()
    if not words or words[0].startswith("#"):
        return None
    if len(words) > 2 or (len(words) == 2 and words[1] not in _SCOPE_NAMES):
        # never echo the line: it holds a token
        raise SettingsError(
            f"{where}: a line is '<token>' or '<token> <scope>', the scope one of {', '.join(_SCOPE_NAMES)}"
        )
    return words[0], _SCOPE_NAMES[words[1]] if len(words) == 2 else Scope.MANAGEMENT


def read_tokens(settings: Settings) -> tuple[ScopedToken, ...]:
    """Every accepted token with its scope: ``settings.token`` (management tokens, one a
    line), ``settings.inference_token`` (inference tokens, one a line) and the lines of
    ``settings.token_file`` (:func:`parse_token_line`); :class:`SettingsError` if the
    token file cannot be read or has a bad line."""
    tokens: list[ScopedToken] = []
    for text, scope in ((settings.token, Scope.MANAGEMENT), (settings.inference_token, Scope.INFERENCE)):
        # one token, or several one a line (as a front process gets them)
        tokens += [(line.strip(), scope) for line in (text or "").splitlines() if line.strip()]
    if settings.token_file:
        path = Path(settings.token_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SettingsError(f"token file {path}: cannot read: {exc.strerror}") from None
        from_file = [parse_token_line(line, f"token file {path}") for line in text.splitlines()]
        tokens += [token for token in from_file if token is not None]
        if not tokens:
            raise SettingsError(f"token file {path}: no token in it")
    return tuple(tokens)


def token_folder(settings: Settings) -> Path | None:
    """The stable folder of the generated token file for ``settings`` (see the module
    docstring); None when there is none (port picked at start, or no safe place)."""
    port = settings.http_port or settings.grpc_port
    if not port:
        return None
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and Path(runtime).is_dir():
        root = Path(runtime) / "actorserve"
    else:
        root = Path(tempfile.gettempdir()) / f"actorserve-{os.getuid()}"
    folder = root / str(port)
    for path in (root, folder):
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(path)
        except OSError as exc:
            log.warning("token folder %s cannot be used (%s): using a temporary folder", path, exc.strerror)
            return None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            log.warning("token folder %s is not private to this user: using a temporary folder", path)
            return None
    return folder


def generate_token_file(folder: Path | None = None) -> Path:
    """A new random token in ``folder``'s ``token`` file (replaced at once, mode 0600),
    or in a new temporary folder (0700); its path is logged, never the token."""
    if folder is None:
        folder = make_temp_folder("auth")
    path = folder / TOKEN_FILE_NAME
    # Written beside it and renamed: a reader sees the old token or the new, never half
    # of one, and a file planted at the final name is replaced, not written through.
    fresh = folder / f".{TOKEN_FILE_NAME}-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    os.replace(fresh, path)
    log.info("management token generated: send 'Authorization: Bearer <token>' with the token in %s", path)
    return path


def remove_token_file(path: Path) -> None:
    """Remove a file made by :func:`generate_token_file`, with its temporary folder (a
    stable folder stays, empty)."""
    if is_temp_folder(path.parent, "auth"):
        shutil.rmtree(path.parent, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def with_token(settings: Settings) -> tuple[Settings, Path | None]:
    """``settings`` with a generated token file when auth is on and no token was given
    (the second value: that file, for the caller to remove), else unchanged."""
    if not auth_enabled(settings) or settings.token or settings.token_file:
        # an inference token alone still gets a generated management token: there is
        # always one, or the management routes could not be used at all
        return settings, None
    path = generate_token_file(token_folder(settings))
    return attrs.evolve(settings, token_file=str(path)), path


def take_tokens(variable: str, inference_variable: str, file_variable: str) -> tuple[str | None, str | None]:
    """The tokens given to this process, (management, inference), each one a line or
    None, taken out of its environment so that model code (and any process it starts)
    cannot read them there: ``variable`` (management), ``inference_variable``
    (inference), and ``file_variable`` (the token file's path, already read into the
    settings by the CLI) is removed too. In a front process of the multi-process server,
    also the tokens its parent handed over (:func:`token_handoff`), each to its scope; the
    descriptor is closed."""
    management = os.environ.pop(variable, None) or None
    inference = os.environ.pop(inference_variable, None) or None
    os.environ.pop(file_variable, None)
    fd = os.environ.pop(TOKENS_FD_VAR, None)
    if fd is not None:
        handed = [parse_token_line(line, "handed tokens") for line in _read_all(int(fd)).splitlines()]
        given = [t for t in handed if t is not None]
        management = _lines(management, [t for t, scope in given if scope is Scope.MANAGEMENT])
        inference = _lines(inference, [t for t, scope in given if scope is Scope.INFERENCE])
    return management, inference


def _lines(first: str | None, more: list[str]) -> str | None:
    return "\n".join(t for t in (first, *more) if t) or None


def token_handoff(tokens: tuple[ScopedToken, ...]) -> IO[bytes] | None:
    """An unnamed file (mode 0600, unlinked as it is made, so no path leads to it) holding
    ``tokens``, ``<token> <scope>`` a line, for the front processes to inherit by
    descriptor (the caller passes it in :data:`TOKENS_FD_VAR` and closes the file when
    they are done). None when there is no token to hand over."""
    if not tokens:
        return None
    handoff = tempfile.TemporaryFile()
    handoff.write("".join(f"{token} {scope.value}\n" for token, scope in tokens).encode())
    handoff.flush()
    return handoff


def _read_all(fd: int) -> str:
    """All of the file at ``fd``, read at explicit offsets (the fronts share one open file,
    so none may move its position); then ``fd`` is closed."""
    data = b""
    try:
        while chunk := os.pread(fd, 65536, len(data)):
            data += chunk
    finally:
        os.close(fd)
    return data.decode()


__all__ = [
    "TOKENS_FD_VAR",
    "auth_enabled",
    "generate_token_file",
    "ScopedToken",
    "parse_token_line",
    "read_tokens",
    "remove_token_file",
    "take_tokens",
    "token_folder",
    "token_handoff",
    "with_token",
]
