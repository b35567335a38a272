"""Settings: server-wide (CLI flags, ``ACTORSERVE_*`` variables), and, re-exported from
:mod:`actorserve.modelsettings`, per model (``model-settings.json``).

Nothing here is read at import time; callers load settings and pass them down.
"""

from __future__ import annotations

import re
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
    "HELP",
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
#: a ``sequence_headers`` value of one's own: the header's name (an HTTP token)
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
#: headers the server reads or sends for something else: never a sequence's id
_TAKEN_HEADERS = frozenset(
    {
        *("sequence-start", "sequence-end", "sequence-cancel", "actorserve-replica"),
        *("content-length", "content-encoding", "content-type", "accept-encoding"),
        *("inference-header-content-length", "authorization", "host", "connection"),
    }
)


def _sequence_headers(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value in SEQUENCE_HEADER_PRESETS:
        return
    if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value) or value.lower() in _TAKEN_HEADERS:
        raise BadSetting(
            attribute.name,
            f"must be {', '.join(SEQUENCE_HEADER_PRESETS)} or a header name (letters, digits, '-', '_') "
            "the server does not read for something else",
        )


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


#: the key of a setting's help in its field's ``metadata``
HELP = "help"


def _help(text: str) -> dict[str, str]:
    """A field's ``metadata``: ``text`` is the one text of the setting, the help of its CLI
    option (:mod:`actorserve.__main__`) and its row in docs/cli.md (:mod:`actorserve.clidocs`)."""
    return {HELP: text}


@attrs.frozen
class Settings:
    """Server-wide settings. ``http_port``/``grpc_port`` 0 picks a free port; ``None``
    turns that transport off.

    Every value is checked here, for the CLI and embedders alike: a bad one raises
    :class:`BadSetting` naming the field (``"grace_period must be >= 0"``). The CLI
    (``python -m actorserve``) makes one option and one ``ACTORSERVE_*`` variable of
    every field but ``models``. Each field's ``metadata[HELP]`` says what it holds: the
    help of its option and its row in docs/cli.md are made from it."""

    models: tuple[ModelSettings, ...] = attrs.field(
        default=(),
        metadata=_help(
            "the model versions to serve (the CLI: those of the model-settings.json files in MODELS_DIR)"
        ),
    )
    host: str = attrs.field(
        default="127.0.0.1",
        validator=_address,
        metadata=_help("address the REST and gRPC ports listen on ('0.0.0.0': every interface)"),
    )
    http_port: int | None = attrs.field(
        default=8080,
        validator=_port,
        metadata=_help("REST port; '0' picks a free port (the log says which); 'off' turns REST off"),
    )
    grpc_port: int | None = attrs.field(
        default=8081,
        validator=_port,
        metadata=_help("gRPC port; '0' picks a free port; 'off' turns gRPC off"),
    )
    ts_inference_grpc_port: int | None = attrs.field(
        default=None,
        validator=_port,
        metadata=_help(
            "an extra port serving only TorchServe's gRPC InferenceAPIsService (its clients default to "
            "7070); both TorchServe services are on the gRPC port anyway (see docs/torchserve.md#ports)"
        ),
    )
    ts_management_grpc_port: int | None = attrs.field(
        default=None,
        validator=_port,
        metadata=_help(
            "an extra port serving only TorchServe's gRPC ManagementAPIsService (its clients default to 7071)"
        ),
    )
    ts_management_http_port: int | None = attrs.field(
        default=None,
        validator=_port,
        metadata=_help(
            "an extra port serving only TorchServe's management REST paths (/models...) and /ping, behind "
            "the same token (TorchServe's is 8081, the gRPC port's default here)"
        ),
    )
    max_body_bytes: int = attrs.field(
        default=64 * 1024 * 1024,
        validator=_at_least(1),
        metadata=_help("largest REST request body, in bytes (64 MiB)"),
    )
    read_timeout: float = attrs.field(
        default=30.0,
        validator=_seconds,
        metadata=_help(
            "seconds a REST request's body has to arrive once its head has: a slower one is answered 408 "
            "and its connection closed, before any model work starts; and a gRPC connection's HTTP/2 frame "
            "(or preface) once it started: slower, GOAWAY and closed; '0': no limit "
            "(see docs/reliability.md#bad-input, docs/grpc.md#idle-and-slow-connections)"
        ),
    )
    grace_period: float = attrs.field(
        default=10.0,
        validator=_seconds,
        metadata=_help("seconds in-flight requests get to finish on shutdown before they are cancelled"),
    )
    drain_timeout: float = attrs.field(
        default=0.0,
        validator=_seconds,
        metadata=_help(
            "seconds a server that got SIGTERM keeps serving the sequences it holds before the shutdown of "
            "--grace-period: meanwhile it is not ready, new sequence starts are refused 503 with "
            "Retry-After (gRPC UNAVAILABLE); it ends early once no sequence is open; '0': off. Both "
            "process shapes (see docs/deploy.md#drain)"
        ),
    )
    gzip_min_bytes: int = attrs.field(
        default=1024,
        validator=_at_least(0),
        metadata=_help("smallest REST response gzipped for a client that accepts gzip, in bytes"),
    )
    keep_alive_timeout: float = attrs.field(
        default=5.0,
        validator=_seconds,
        metadata=_help("seconds an idle keep-alive HTTP connection is kept open"),
    )
    grpc_idle_timeout: float = attrs.field(
        default=300.0,
        validator=_seconds,
        metadata=_help(
            "seconds a gRPC connection with no open call is kept open, then GOAWAY and closed ('0': no "
            "limit); longer than HTTP's because a gRPC channel is meant to be kept and reused "
            "(see docs/grpc.md#idle-and-slow-connections)"
        ),
    )
    backlog: int = attrs.field(
        default=2048,
        validator=_at_least(1),
        metadata=_help(
            "connections each listening port queues before the server accepts them; the kernel caps it "
            "at net.core.somaxconn (see docs/reliability.md#connection-surge)"
        ),
    )
    http_parser: str = attrs.field(
        default="httptools",
        validator=_one_of(*HTTP_PARSERS),
        metadata=_help(
            "HTTP/1.1 implementation under hypercorn: 'httptools' (llhttp, the C parser uvicorn uses; "
            "faster) or 'h11' (hypercorn's own, pure Python; see docs/rest.md#http11)"
        ),
    )
    grpc_stream_dialect: str = attrs.field(
        default="triton",
        validator=_one_of(*GRPC_STREAM_DIALECTS),
        metadata=_help(
            "ModelStreamInfer flavour: 'triton' (ModelStreamInferResponse with error_message) or "
            "'mlserver' (plain ModelInferResponse messages)"
        ),
    )
    grpc_stream_max_inflight: int = attrs.field(
        default=64,
        validator=_at_least(1),
        metadata=_help("requests in flight on one ModelStreamInfer call before the server stops reading it"),
    )
    log_level: str = attrs.field(
        default="INFO",
        converter=_upper,
        validator=_one_of(*LOG_LEVELS),
        metadata=_help("'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL' (any case)"),
    )
    api_workers: int = attrs.field(
        default=2,
        validator=_at_least(0),
        metadata=_help(
            "front processes serving REST and gRPC beside one engine process ('0': everything in one "
            "process; see docs/architecture.md)"
        ),
    )
    cors_allow_origin: tuple[str, ...] = attrs.field(
        default=(),
        converter=_origins,
        validator=_origin_list,
        metadata=_help(
            "browser origin allowed to call the REST API (CORS): repeat the flag or give a comma list; "
            "'*' allows any (see docs/management.md#cors)"
        ),
    )
    poll_repository: float = attrs.field(
        default=0.0,
        validator=_seconds,
        metadata=_help(
            "seconds between looks at the model folders for added, changed or removed models; '0': off, "
            "models load and unload on request only (see docs/management.md#watching-the-model-folders)"
        ),
    )
    log_format: str = attrs.field(
        default="text",
        validator=_one_of(*LOG_FORMATS),
        metadata=_help("'text', or 'json': one JSON object per log line (see docs/logging.md)"),
    )
    access_log: bool = attrs.field(
        default=False,
        validator=_bool,
        metadata=_help("log one structured line per request (logger actorserve.access; see docs/logging.md)"),
    )
    otel: bool = attrs.field(
        default=False,
        validator=_bool,
        metadata=_help(
            "export OpenTelemetry traces: a span per request, W3C traceparent taken from the client, "
            "the engine's spans in the same trace; the exporter is configured by the standard OTEL_* "
            "variables (OTLP by default); needs the actorserve[otel] extra (see docs/metrics.md#traces)"
        ),
    )
    no_auth: bool = attrs.field(
        default=False,
        validator=_bool,
        metadata=_help(
            "serve the management routes (repository load/unload, ...) without a bearer token "
            "(see docs/security.md)"
        ),
    )
    auth_inference: bool = attrs.field(
        default=False,
        validator=_bool,
        metadata=_help(
            "inference routes (infer, generate, the streams; gRPC ModelInfer, ModelStreamInfer) need the "
            "bearer token too"
        ),
    )
    auth_metrics: bool = attrs.field(
        default=False, validator=_bool, metadata=_help("GET /metrics needs the bearer token too")
    )
    allow_load_overrides: tuple[str, ...] = attrs.field(
        default=(),
        converter=_names,
        validator=_name_list,
        metadata=_help(
            "keys a load request's parameters.config or a TorchServe registration may set although they "
            "name code, a path, a URL or an environment variable: parameters keys the model's class does "
            "not declare safe (a TorchServe model's model_dir, handler; the OpenAI proxy's extra, which "
            "holds base_url and api_key_env; MLServer's uri; ...), a registration's handler, and url for "
            "an archive outside the model folders. Repeat the flag or give a comma list; '*' allows every "
            "key. Without it such a request is answered 400 naming the key "
            "(see docs/security.md#load-overrides)"
        ),
    )
    bind_sequences_to_token: bool = attrs.field(
        default=False,
        validator=_bind_needs_auth,
        metadata=_help(
            "a sequence answers only requests carrying the token that opened it; needs --auth-inference "
            "(see docs/sequences.md#ids-and-who-may-use-them)"
        ),
    )
    token_file: str | None = attrs.field(
        default=None,
        validator=_optional_text,
        metadata=_help(
            "file of bearer tokens, '<token> [management|inference]' a line (management when no scope "
            "is given; '#' comments allowed); or one management token in ACTORSERVE_TOKEN and inference "
            "tokens in ACTORSERVE_INFERENCE_TOKEN (variables only, so they never show in ps; the server "
            "removes these variables from its environment once read, see "
            "docs/security.md#the-token-in-the-processes). An inference token may infer, never load, "
            "unload or scale (403). With no management token given and auth on, one is generated into '$XDG_RUNTIME_DIR/actorserve/<port>/token' (mode 0600; the "
            "same path at every start, see docs/security.md#where-tokens-come-from) whose path is logged"
        ),
    )
    max_archive_bytes: int = attrs.field(
        default=16 * 1024**3,
        validator=_at_least(1),
        metadata=_help(
            "largest total a TorchServe .mar may extract to, in bytes (16 GiB), counted while extracting; "
            "a load past it fails naming the setting (see docs/security.md#limits)"
        ),
    )
    max_archive_members: int = attrs.field(
        default=100_000,
        validator=_at_least(1),
        metadata=_help("most files and folders one TorchServe .mar may hold"),
    )
    replica_id: str | None = attrs.field(
        default=None,
        validator=_replica_id,
        metadata=_help(
            "this server's name behind a proxy: sent as the actorserve-replica header on every REST "
            "response and in every gRPC response's initial metadata, a label on /metrics, and the prefix "
            "of the sequence ids the server makes; 1 to 63 letters, digits, '.' or '-' (default: the host "
            "name). Given, the server is one replica behind a proxy: an unknown sequence id is reported "
            "as a routing fault, sequence_not_held (see docs/deploy.md#replica-identity)"
        ),
    )
    sequence_headers: str = attrs.field(
        default="oip",
        validator=_sequence_headers,
        metadata=_help(
            "which REST headers carry a sequence's id: 'oip' (sequence-id), 'torchserve' "
            "(ts_request_sequence_id), 'sagemaker' (SageMaker's stateful session headers: "
            "X-Amzn-SageMaker-Session-Id, answered with X-Amzn-SageMaker-New-Session-Id / "
            "-Closed-Session-Id), or a header name of your own, read and echoed (see "
            "docs/deploy.md#header-presets)"
        ),
    )
    token: str | None = attrs.field(
        default=None,
        repr=False,
        validator=_optional_text,
        metadata=_help(
            "a management bearer token, or several one a line (the CLI reads it from ACTORSERVE_TOKEN only, "
            "never a flag, and removes that variable from its environment)"
        ),
    )
    inference_token: str | None = attrs.field(
        default=None,
        repr=False,
        validator=_optional_text,
        metadata=_help(
            "an inference-only bearer token, or several one a line: it may infer (and read /metrics), "
            "never manage models (the CLI reads it from ACTORSERVE_INFERENCE_TOKEN only, and removes that "
            "variable from its environment)"
        ),
    )

    def with_models(self, models: Iterable[ModelSettings]) -> Settings:
        return attrs.evolve(self, models=tuple(models))
