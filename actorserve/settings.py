"""Settings: server-wide (CLI flags, ``ACTORSERVE_*`` variables), and, re-exported from
:mod:`actorserve.modelsettings`, per model (``model-settings.json``).

Nothing here is read at import time; callers load settings and pass them down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

import attrs

from .modelsettings import (
    ANY_DATATYPE,
    ANY_DATATYPE_SHOWN_AS,
    MODEL_SETTINGS_FILE,
    ModelSettings,
    SequenceSettings,
    SettingsError,
    TensorSpec,
    discover_models,
    load_model_settings,
    model_settings_from_dict,
)
from .replica import REPLICA_ID

__all__ = [
    "ANY_DATATYPE",
    "ANY_DATATYPE_SHOWN_AS",
    "GRPC_STREAM_DIALECTS",
    "HTTP_PARSERS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MODEL_SETTINGS_FILE",
    "SEQUENCE_HEADER_PRESETS",
    "BadSetting",
    "ModelSettings",
    "SequenceSettings",
    "Settings",
    "SettingsError",
    "TensorSpec",
    "discover_models",
    "load_model_settings",
    "model_settings_from_dict",
]


class BadSetting(SettingsError):
    """One server-wide setting has a value it cannot take.

    ``field`` is the :class:`Settings` attribute, ``reason`` what it must be
    (``"must be >= 1"``); the message is both, so a front end can name its own option."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
GRPC_STREAM_DIALECTS = ("triton", "mlserver")


_Validator = Callable[[object, "attrs.Attribute[Any]", Any], None]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(minimum: int) -> _Validator:
    """An attrs validator: an integer >= ``minimum``."""

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not _is_int(value):
            raise BadSetting(attribute.name, f"must be an integer >= {minimum}")
        if value < minimum:
            raise BadSetting(attribute.name, f"must be >= {minimum}")

    return check


def _seconds(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise BadSetting(attribute.name, "must be >= 0")


def _address(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise BadSetting(attribute.name, "must be a host name or IP address")


def _port(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not (_is_int(value) and 0 <= value <= 65535):
        raise BadSetting(attribute.name, "must be 0-65535 or off")


HTTP_PARSERS = ("httptools", "h11")
#: ``sequence_headers`` presets (actorserve/transport/rest/sequence_headers.py)
SEQUENCE_HEADER_PRESETS = ("oip", "torchserve", "sagemaker")


def _one_of(*choices: str) -> _Validator:
    """An attrs validator: one of ``choices``."""
    quoted = " or ".join(repr(c) for c in choices) if len(choices) == 2 else ", ".join(choices)
    prefix = "must be " if len(choices) == 2 else "must be one of "

    def check(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value not in choices:
            raise BadSetting(attribute.name, prefix + quoted)

    return check


def _bool(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise BadSetting(attribute.name, "must be true or false")


def _bind_needs_auth(settings: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    _bool(settings, attribute, value)
    if value and not settings.auth_inference:
        # without a token on inference, callers cannot be told apart: nothing to bind to
        raise BadSetting(attribute.name, "needs auth_inference (sequences are bound to the caller's token)")


def _optional_text(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise BadSetting(attribute.name, "must be a non-empty string")


def _replica_id(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not REPLICA_ID.fullmatch(value)):
        raise BadSetting(
            attribute.name, "must be 1 to 63 letters, digits, '.' or '-', starting with a letter or digit"
        )


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _origins(value: Any) -> Any:
    """Origins from a comma list or from several values (each may be a comma list)."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, (list, tuple)):
        return value
    return tuple(o.strip().rstrip("/") for v in values for o in str(v).split(",") if o.strip())


def _names(value: Any) -> Any:
    """Names from a comma list or from several values (each may be a comma list)."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, (list, tuple, frozenset, set)):
        return value
    return tuple(n.strip() for v in values for n in str(v).split(",") if n.strip())


def _name_list(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, tuple) or not all(isinstance(n, str) and n for n in value):
        raise BadSetting(attribute.name, "must be names, a comma list (or *)")


def _origin_list(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, tuple) or not all(
        o == "*" or o.startswith(("http://", "https://")) for o in value
    ):
        raise BadSetting(attribute.name, "must be origins like https://app.example.com (or *)")


@attrs.frozen
class Settings:
    """Server-wide settings. ``http_port``/``grpc_port`` 0 picks a free port; ``None``
    turns that transport off.

    Every value is checked here, for the CLI and embedders alike: a bad one raises
    :class:`BadSetting` naming the field (``"grace_period must be >= 0"``). The CLI
    (``python -m actorserve``) makes one option and one ``ACTORSERVE_*`` variable of
    every field but ``models``."""

    models: tuple[ModelSettings, ...] = ()
    #: address the REST and gRPC listeners bind to.
    host: str = attrs.field(default="127.0.0.1", validator=_address)
    http_port: int | None = attrs.field(default=8080, validator=_port)
    grpc_port: int | None = attrs.field(default=8081, validator=_port)
    #: extra ports serving only TorchServe's gRPC inference / management service, and only
    #: its management REST paths (None: off; see docs/torchserve.md#ports).
    ts_inference_grpc_port: int | None = attrs.field(default=None, validator=_port)
    ts_management_grpc_port: int | None = attrs.field(default=None, validator=_port)
    ts_management_http_port: int | None = attrs.field(default=None, validator=_port)
    #: largest request body accepted over REST, in bytes.
    max_body_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_at_least(1))
    #: seconds a REST request's body has to arrive once its head has (slower: 408, closed),
    #: and a gRPC connection's HTTP/2 frame once it started (slower: GOAWAY, closed). 0: off.
    read_timeout: float = attrs.field(default=30.0, validator=_seconds)
    #: seconds in-flight requests get to finish on shutdown before they are cancelled.
    grace_period: float = attrs.field(default=10.0, validator=_seconds)
    #: seconds a SIGTERM'd server keeps serving its open sequences before the shutdown
    #: above (not ready, new sequence starts refused 503 / UNAVAILABLE; 0: off). In both
    #: process shapes; docs/deploy.md#drain.
    drain_timeout: float = attrs.field(default=0.0, validator=_seconds)
    #: gzip non-streaming REST responses larger than this when the client accepts gzip.
    gzip_min_bytes: int = attrs.field(default=1024, validator=_at_least(0))
    #: seconds an idle keep-alive HTTP connection is kept open.
    keep_alive_timeout: float = attrs.field(default=5.0, validator=_seconds)
    #: seconds a gRPC connection with no open call is kept open (then GOAWAY; 0: no
    #: limit). Longer than HTTP's: a gRPC channel is meant to be kept and reused.
    grpc_idle_timeout: float = attrs.field(default=300.0, validator=_seconds)
    #: connections each listening socket queues before the server accepts them (the
    #: kernel caps it at net.core.somaxconn).
    backlog: int = attrs.field(default=2048, validator=_at_least(1))
    #: HTTP/1.1 implementation under hypercorn: "httptools" (llhttp) or "h11" (hypercorn's own).
    http_parser: str = attrs.field(default="httptools", validator=_one_of(*HTTP_PARSERS))
    #: ModelStreamInfer flavour: "triton" (ModelStreamInferResponse envelope) or "mlserver".
    grpc_stream_dialect: str = attrs.field(default="triton", validator=_one_of(*GRPC_STREAM_DIALECTS))
    #: requests in flight on one ModelStreamInfer call before the server stops reading it.
    grpc_stream_max_inflight: int = attrs.field(default=64, validator=_at_least(1))
    log_level: str = attrs.field(default="INFO", converter=_upper, validator=_one_of(*LOG_LEVELS))
    #: front processes serving REST and gRPC (1: everything in one process).
    api_workers: int = attrs.field(default=2, validator=_at_least(0))
    #: browser origins allowed to call the REST API (CORS); "*" allows any.
    cors_allow_origin: tuple[str, ...] = attrs.field(default=(), converter=_origins, validator=_origin_list)
    #: seconds between looks at the model folders for added, changed or removed models (0: off).
    poll_repository: float = attrs.field(default=0.0, validator=_seconds)
    #: "text" or "json" (one JSON object per log line, access lines with their fields).
    log_format: str = attrs.field(default="text", validator=_one_of(*LOG_FORMATS))
    #: one structured line per request on the logger ``actorserve.access``.
    access_log: bool = attrs.field(default=False, validator=_bool)
    #: management routes without a token (see docs/security.md).
    no_auth: bool = attrs.field(default=False, validator=_bool)
    #: inference routes need a token too.
    auth_inference: bool = attrs.field(default=False, validator=_bool)
    #: ``GET /metrics`` needs a token too.
    auth_metrics: bool = attrs.field(default=False, validator=_bool)
    #: keys a load or registration request may set although they name code, a path, a URL
    #: or an environment variable (``handler``, ``model_dir``, ``url``, the proxy's
    #: ``extra``, ...; ``*``: any); none by default. See docs/security.md.
    allow_load_overrides: tuple[str, ...] = attrs.field(default=(), converter=_names, validator=_name_list)
    #: a sequence answers only requests with the token that opened it (needs auth_inference).
    bind_sequences_to_token: bool = attrs.field(default=False, validator=_bind_needs_auth)
    #: a file of bearer tokens, one a line (none and auth on: one is generated).
    token_file: str | None = attrs.field(default=None, validator=_optional_text)
    #: largest total a TorchServe ``.mar`` may extract to, in bytes (counted while extracting).
    max_archive_bytes: int = attrs.field(default=16 * 1024**3, validator=_at_least(1))
    #: most files and folders one ``.mar`` may hold.
    max_archive_members: int = attrs.field(default=100_000, validator=_at_least(1))
    #: this server's name behind a proxy: the ``actorserve-replica`` response header and
    #: gRPC metadata, the replica label on /metrics, the prefix of server-made sequence
    #: ids (None: the host name; see docs/deploy.md).
    replica_id: str | None = attrs.field(default=None, validator=_replica_id)
    #: which REST headers carry a sequence's id: ``oip`` (``sequence-id``), ``torchserve``
    #: (``ts_request_sequence_id``) or ``sagemaker`` (its stateful session headers; see
    #: docs/deploy.md#header-presets).
    sequence_headers: str = attrs.field(default="oip", validator=_one_of(*SEQUENCE_HEADER_PRESETS))
    #: a bearer token, or several one a line (the CLI reads it from ACTORSERVE_TOKEN only,
    #: never a flag, and removes that variable from its environment).
    token: str | None = attrs.field(default=None, repr=False, validator=_optional_text)

    def with_models(self, models: Iterable[ModelSettings]) -> Settings:
        return attrs.evolve(self, models=tuple(models))
