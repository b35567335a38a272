"""Where the server's bearer tokens come from (the checks are in
:mod:`actorserve.transport.auth`).

Tokens: ``Settings.token`` (the CLI fills it from ``ACTORSERVE_TOKEN``, never from a
flag, so it does not show in ``ps``) and the lines of ``Settings.token_file`` (one token
a line; blank lines and ``#`` comments skipped). When auth is on and neither is given,
:func:`generate_token_file` makes a random token, writes it to a new file readable only
by this user (mode 0600, in a fresh 0700 folder) and logs the file's path, never the
token. The server removes that file when it stops.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import attrs

from .settings import Settings, SettingsError

log = logging.getLogger("actorserve.auth")

TOKEN_FILE_NAME = "token"


def auth_enabled(settings: Settings) -> bool:
    """Some route needs a token."""
    return not settings.no_auth or settings.auth_inference or settings.auth_metrics


def read_tokens(settings: Settings) -> tuple[str, ...]:
    """Every accepted token; :class:`SettingsError` if the token file cannot be read."""
    tokens: list[str] = []
    if settings.token:
        tokens.append(settings.token.strip())
    if settings.token_file:
        path = Path(settings.token_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SettingsError(f"token file {path}: cannot read: {exc.strerror}") from None
        tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not tokens:
            raise SettingsError(f"token file {path}: no token in it")
    return tuple(t for t in tokens if t)


def generate_token_file() -> Path:
    """A new random token in a new file (mode 0600, folder 0700); its path is logged."""
    folder = Path(tempfile.mkdtemp(prefix="actorserve-auth-"))
    folder.chmod(0o700)
    path = folder / TOKEN_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    log.info("management token generated: send 'Authorization: Bearer <token>' with the token in %s", path)
    return path


def remove_token_file(path: Path) -> None:
    """Remove a file made by :func:`generate_token_file`, with its folder."""
    shutil.rmtree(path.parent, ignore_errors=True)


def with_token(settings: Settings) -> tuple[Settings, Path | None]:
    """``settings`` with a generated token file when auth is on and no token was given
    (the second value: that file, for the caller to remove), else unchanged."""
    if not auth_enabled(settings) or settings.token or settings.token_file:
        return settings, None
    path = generate_token_file()
    return attrs.evolve(settings, token_file=str(path)), path


__all__ = ["auth_enabled", "generate_token_file", "read_tokens", "remove_token_file", "with_token"]
