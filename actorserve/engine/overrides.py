"""What a management request may change about a model it loads, and what it may not.

A load request's ``parameters.config`` (REST load, gRPC RepositoryModelLoad: Triton's
``config`` override) is laid over the model's own settings (:func:`override_settings`),
and a TorchServe registration names an archive and may name its handler
(:func:`check_registration`). Both come from whoever holds the management token (or from
anyone, with ``no_auth``), while the model's files come from the operator. So a request
may change the model-settings.json fields that are limits and shapes (:data:`OVERRIDABLE`)
and the ``parameters`` the model's class declares safe
(:attr:`actorserve.model.Model.overridable_parameters`, plus :data:`ALWAYS_OVERRIDABLE`),
but nothing that names code, a file or folder, a URL or host, or an environment
variable: a TorchServe model's ``model_dir`` and ``handler`` (the engine imports and runs
that file), the OpenAI proxy's ``extra`` (``base_url``: the server would POST anywhere and
echo the answer; ``api_key_env``: any variable, sent as the bearer key), MLServer's
``uri``, or any parameter the class does not declare. The operator lets such keys through
by name with the server setting ``allow_load_overrides`` (``--allow-load-overrides``;
``*``: every key); a refusal is a :class:`LoadOverrideRefused` (400 / INVALID_ARGUMENT)
naming the key and that setting.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import attrs

from ..jsonvalues import kind
from ..settings import ModelSettings, SettingsError, model_settings_from_dict

#: model-settings.json keys a load request's ``parameters.config`` may set: limits,
#: shapes and names shown in metadata, none of which names code, a path, a URL or a variable
OVERRIDABLE = frozenset(
    {
        "parameters",
        "max_batch_size",
        "max_batch_time",
        "workers",
        "sequence",
        "reply_buffer",
        "max_pending",
        "platform",
        "inputs",
        "outputs",
        "request",
    }
)

#: ``parameters`` keys every model takes from a load request (``version`` names the
#: version the settings load as, nothing outside the server)
ALWAYS_OVERRIDABLE = frozenset({"version"})

#: the value of ``allow_load_overrides`` that lets every key through
ANY_KEY = "*"


class LoadOverrideRefused(SettingsError):
    """A management request tried to set something that names code, a path, a URL or an
    environment variable; ``key`` is what it tried to set, ``why`` says why it may not.
    A :class:`BadInput` (400 / INVALID_ARGUMENT); the message names the server setting
    that would allow it."""

    def __init__(self, where: str, key: str, why: str) -> None:
        super().__init__(
            f"{where}: {why} (the server's operator can allow it: "
            f"--allow-load-overrides {key} or ACTORSERVE_ALLOW_LOAD_OVERRIDES={key})"
        )
        self.key = key


def allows(allowed: Collection[str], key: str) -> bool:
    """The operator's ``allow_load_overrides`` lets ``key`` through."""
    return key in allowed or ANY_KEY in allowed


def override_settings(
    settings: ModelSettings,
    config: Mapping[str, Any],
    allowed: Collection[str] = (),
    declared: frozenset[str] = frozenset(),
) -> ModelSettings:
    """``settings`` with the model-settings.json fields of ``config`` (a load request's
    ``parameters.config``, as Triton takes a config override) in place of its own:
    ``parameters`` and ``sequence`` are merged key by key, the others replaced.

    A ``parameters`` key passes when it is in :data:`ALWAYS_OVERRIDABLE`, in ``declared``
    (the model class's :attr:`~actorserve.model.Model.overridable_parameters`) or in
    ``allowed`` (the operator's ``allow_load_overrides``); any other is refused with
    :class:`LoadOverrideRefused`. :class:`SettingsError` names a field that cannot be set
    or a bad value."""
    where = f"model {settings.name!r}: parameters.config"
    if not isinstance(config, Mapping):
        raise SettingsError(f"{where}: expected a JSON object of model-settings.json fields")
    if config.get("name", settings.name) != settings.name:
        raise SettingsError(f"{where}: 'name' cannot change (got {config.get('name')!r})")
    unknown = set(config) - OVERRIDABLE - {"name"}
    if unknown:
        raise SettingsError(
            f"{where}: cannot set {', '.join(sorted(unknown))} (settable: {', '.join(sorted(OVERRIDABLE))})"
        )
    for key in ("parameters", "sequence", "request"):
        value = config.get(key)
        if value is not None and not isinstance(value, Mapping):
            # never converted: a list of pairs is not an object, whatever dict() makes of it
            raise SettingsError(f"{where}.{key}: expected a JSON object, not {kind(value)}")
    parameters = config.get("parameters")
    merged = dict(config)
    if isinstance(config.get("sequence"), Mapping):
        merged["sequence"] = {**attrs.asdict(settings.sequence), **config["sequence"]}
    if isinstance(parameters, Mapping):
        merged["parameters"] = {**settings.parameters, **parameters}
    data = {**merged, "name": settings.name, "implementation": settings.implementation}
    parsed = model_settings_from_dict(data, folder=settings.folder, where=where)
    changes: dict[str, Any] = {}
    for key in merged:
        if key == "request":
            changes["request_parameters"] = parsed.request_parameters
        elif key == "parameters":
            changes.update(parameters=parsed.parameters, version=parsed.version)
        elif key != "name":
            changes[key] = getattr(parsed, key)
    result = attrs.evolve(settings, **changes)
    _check_result(settings, result, allowed, declared, where)
    return result


#: the :class:`ModelSettings` fields a load request may change (the parsed form of
#: :data:`OVERRIDABLE`); ``parameters`` is checked key by key
OVERRIDABLE_FIELDS = frozenset(
    {
        "parameters",
        "version",
        "max_batch_size",
        "max_batch_time",
        "workers",
        "sequence",
        "reply_buffer",
        "max_pending",
        "platform",
        "inputs",
        "outputs",
        "request_parameters",
    }
)


def _check_result(
    before: ModelSettings,
    after: ModelSettings,
    allowed: Collection[str],
    declared: frozenset[str],
    where: str,
) -> None:
    """The policy, on the settings as parsed: whatever spelling the request used, every
    field that differs from the model's own must be one a request may change, and every
    ``parameters`` key whose value differs (or is new) must be declared or allowed."""
    for field in attrs.fields(ModelSettings):
        if field.name not in OVERRIDABLE_FIELDS and not _same(
            getattr(before, field.name), getattr(after, field.name)
        ):
            raise SettingsError(f"{where}: cannot set {field.name}")
    missing = object()
    for key in sorted(set(before.parameters) | set(after.parameters)):
        if _same(before.parameters.get(key, missing), after.parameters.get(key, missing)):
            continue
        if key not in ALWAYS_OVERRIDABLE and key not in declared and not allows(allowed, key):
            raise LoadOverrideRefused(
                f"{where}.parameters",
                key,
                f"{key!r} cannot be set by a load request: {_implementation(before)} declares only "
                f"{sorted(ALWAYS_OVERRIDABLE | declared)} safe to override, and other model parameters "
                "may name code, files, URLs or environment variables",
            )


def _same(a: object, b: object) -> bool:
    """``a`` and ``b`` are the same value of the same types, all the way down (``1``,
    ``1.0`` and ``true`` are equal in Python, not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping)
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple))
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def needs_declaration(config: Mapping[str, Any], allowed: Collection[str]) -> bool:
    """``config`` sets a ``parameters`` key that only the model class's declaration can let
    through, so the caller must import the class to read it (else it need not)."""
    parameters = config.get("parameters") if isinstance(config, Mapping) else None
    if not isinstance(parameters, Mapping):
        return False
    return any(key not in ALWAYS_OVERRIDABLE and not allows(allowed, key) for key in parameters)


def check_registration(path: str, handler: str | None, allowed: Collection[str]) -> None:
    """A TorchServe registration's ``handler`` (the code the engine imports and runs) is the
    archive's own unless the operator allows ``handler``; :class:`LoadOverrideRefused`.
    Where the archive may be (``url``) is checked by
    :meth:`actorserve.engine.repository.ModelRepository.locate`."""
    if handler is not None and not allows(allowed, "handler"):
        raise LoadOverrideRefused(
            f"registering {path!r}",
            "handler",
            "'handler' cannot be set by a registration: it names the Python "
            "code the server imports and runs (the archive's manifest names its own)",
        )


def _implementation(settings: ModelSettings) -> str:
    impl = settings.implementation
    return impl.__qualname__ if isinstance(impl, type) else str(impl)
