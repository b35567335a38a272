"""The engine: every loaded model version, in one nursery, behind one API.

The transports only parse, call the engine, and encode; so does any trio program that
embeds actorserve::

    async with actorserve.open_engine(settings) as engine:
        response = await engine.infer(request, model="identity")
        async with engine.infer_stream(request, model="streamer") as responses:
            async for response in responses: ...
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ..actors.host import ModelHost
from ..actors.inflight import Inflight
from ..actors.reports import describe, inference_statistics, info, metadata, model_statistics
from ..api import (
    EngineAPI,
    InferenceStatistics,
    ModelDescription,
    ModelInfo,
    ModelMetadata,
    ModelState,
    ModelStatistics,
    RepositoryEntry,
    ResponseIterator,
    UnaryCall,
)
from ..errors import BadInput, ModelFailed, ModelNotFound, ModelNotReady, ShuttingDown
from ..exceptiongroups import raise_single
from ..metrics import Metrics
from ..model import BatchModel, Model
from ..replica import mint_id, minting, naming, replica_id
from ..settings import ModelSettings, Settings, SettingsError
from ..types import InferenceRequest, InferenceResponse
from ..unary import dispatch
from ..validation import RequestContract
from .catalog import UNLOADED, Catalog, Watchers, version_key
from .default_version import DefaultVersions
from .loadfailure import explain, underlying
from .polling import poll_repository
from .repository import ModelRepository

log = logging.getLogger("actorserve.engine")  # the package's name: what its log lines have always said

T = TypeVar("T")


class Engine:
    """The in-process engine: owns a :class:`ModelHost` per loaded model version and
    implements :class:`actorserve.api.EngineAPI`. Made by :func:`open_engine`."""

    def __init__(
        self, nursery: trio.Nursery, settings: Settings, repository: ModelRepository | None = None
    ) -> None:
        self.settings = settings
        #: where the hosts record (batches, steps, sequences, rejections; GET /metrics)
        self.metrics = Metrics()
        self.repository = repository or ModelRepository()
        #: why versions that are not served are not (the repository index shows it)
        self.catalog = Catalog()
        #: told whenever model_info / metadata answers may change (the fronts' caches)
        self.watchers = Watchers()
        self._nursery = nursery
        self._hosts: dict[str, dict[str, ModelHost]] = {}
        self._defaults = DefaultVersions()
        #: what each loaded version accepts (absent: it declares nothing)
        self._contracts: dict[ModelHost, RequestContract] = {}
        self._closing = False
        #: every request in flight in any host (and what it left in a batch)
        self._inflight = Inflight()
        #: what this server is called behind a proxy (errors and server-made ids say it)
        self.replica = replica_id(settings.replica_id)
        #: one replica of several behind a proxy (given --replica-id, as deploy/ does): an
        #: unknown sequence id then blames the routing (replica.not_held)
        self.proxied = settings.replica_id is not None
        #: scale-in (actorserve.engine.scalein): not ready, new sequence starts refused
        self.draining = False

    # -- models ------------------------------------------------------------------------

    async def load(self, settings: ModelSettings) -> ModelHost:
        """Load a model version (replacing a loaded one of the same name and version).

        Its model folder's code is imported afresh (:meth:`ModelRepository.implementation`);
        :class:`SettingsError` if it cannot be, :class:`ModelFailed` if the model's
        ``load`` fails."""
        if self._closing:
            raise ShuttingDown("the engine is shutting down")
        try:
            model_class = self.repository.implementation(settings)
        except SettingsError as exc:
            self._load_failed(settings, exc.message)  # the message has the line: no traceback
            raise
        contract = RequestContract.of(settings, model_class)
        host = ModelHost(
            settings,
            model_class,
            inflight=self._inflight,
            metrics=self.metrics.model(settings.name, settings.version),
        )
        if contract is not None:
            self._contracts[host] = contract
        versions = self._hosts.setdefault(settings.name, {})
        default_before = self._defaults.of(settings.name, versions) if versions else None
        if settings.version not in versions:  # visible (LOADING) while it loads
            versions[settings.version] = host
            self.watchers.changed()
        try:
            await self._nursery.start(self._run_host, host)
        except Exception as exc:  # an ExceptionGroup of the nurseries the model's load() ran in
            why = explain(exc, settings.folder, model_class)
            failure = ModelFailed(f"loading model {settings.name!r} failed: {why}")
            self._load_failed(settings, failure.message, underlying(exc))  # its traceback, not the group's
            raise failure from exc
        self.catalog.served(settings.name, settings.version)
        self._defaults.loaded(settings, default_before)
        old = self._hosts.setdefault(settings.name, {}).get(settings.version)
        self._hosts[settings.name][settings.version] = host
        if old is not None and old is not host:
            old.stop()
        self.watchers.changed()
        model = host.model
        batching = f", max_batch_size={model.max_batch_size}" if isinstance(model, BatchModel) else ""
        log.info(
            "loaded model %s version %s (%s, workers=%d%s)",
            settings.name,
            settings.version,
            host.model_class.__name__,
            settings.workers,
            batching,
        )
        return host

    def _load_failed(self, settings: ModelSettings, message: str, exc: BaseException | None = None) -> None:
        """Log ``message`` (one line, then ``exc``'s traceback) and note it in the index. A
        version already loaded serves on (as in Triton): its index row keeps READY and
        tells why the new load did not take."""
        serving = self._hosts.get(settings.name, {}).get(settings.version)
        if serving is not None and serving.state is ModelState.READY:
            message = f"{message} (the version loaded before serves on)"
        log.error("%s", message, exc_info=exc)
        self.catalog.failed(settings.name, settings.version, message)

    async def _run_host(
        self, host: ModelHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await host.run(task_status=task_status)
        finally:
            self._contracts.pop(host, None)
            versions = self._hosts.get(host.name, {})
            if versions.get(host.version) is host:
                del versions[host.version]
                if not versions:
                    self._hosts.pop(host.name, None)
            self.watchers.changed()

    async def unload(self, name: str, version: str | None = None, *, grace: float | None = None) -> None:
        """Unload a model (every version, or one); its sequences end with ``shutdown``.
        In-flight requests get ``grace`` seconds (default: ``settings.grace_period``)."""
        if grace is None:
            grace = self.settings.grace_period
        versions = self._hosts.get(name)
        if not versions:
            raise ModelNotFound(f"model {name!r} is not loaded")
        if version and version not in versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        hosts = [versions[version]] if version else list(versions.values())
        for host in hosts:
            self.watchers.changed()  # drain marks it UNLOADING before it first yields
            await host.drain(grace)
            host.reason = UNLOADED
            host.stop()
            # Look again after the drain: another unload may have removed this host and
            # a load put a new one (or a new table) in its place, which stays.
            current = self._hosts.get(name, {})
            if current.get(host.version) is host:
                del current[host.version]
                self.catalog.failed(host.name, host.version, UNLOADED)
            self._defaults.unloaded(name, host.version, current)
            if not current:
                self._hosts.pop(name, None)
            self.watchers.changed()
        log.info("unloaded model %s%s", name, f" version {version}" if version else "")

    def host(self, name: str | None, version: str | None = None) -> ModelHost:
        """The host of a model version (default: the default or newest version)."""
        if not name:
            raise ModelNotFound("no model name given")
        versions = self._hosts.get(name)
        if not versions:
            raise ModelNotFound(f"model {name!r} is not loaded")
        if version is None or version == "":
            version = self._defaults.of(name, versions)
        host = versions.get(version)
        if host is None:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return host

    def hosts(self) -> list[ModelHost]:
        """Every loaded model version's host (internal: the transports use :meth:`models`)."""
        return [h for versions in self._hosts.values() for h in versions.values()]

    # -- inference -----------------------------------------------------------------------

    def _route(self, request: InferenceRequest, model: str | None, version: str | None) -> ModelHost:
        if self._closing:
            raise ShuttingDown("the engine is shutting down")
        host = self.host(model or request.model_name, version or request.model_version)
        if host.state is ModelState.LOADING:
            raise ModelNotReady(f"model {host.name!r} is not ready")
        contract = self._contracts.get(host)
        if contract is not None:
            contract.check(request)
        mint_id(request, self.replica, draining=self.draining)
        return host

    async def infer(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> InferenceResponse:
        """One response for ``request`` (a streaming model's responses merged)."""
        with naming(self.replica, proxied=self.proxied):
            return await self._route(request, model, version).infer(request)

    @asynccontextmanager
    async def infer_stream(
        self, request: InferenceRequest, *, model: str | None = None, version: str | None = None
    ) -> AsyncIterator[ResponseIterator]:
        """The responses of one request, as produced. Leaving the block cancels it."""
        with naming(self.replica, proxied=self.proxied):
            async with self._route(request, model, version).infer_stream(request) as responses:
                yield responses

    @asynccontextmanager
    async def stream(
        self,
        requests: AsyncIterator[InferenceRequest],
        *,
        model: str,
        version: str | None = None,
    ) -> AsyncIterator[ResponseIterator]:
        """MLServer's ``predict_stream``: a stream of requests in, responses out."""
        if self._closing:
            raise ShuttingDown("the engine is shutting down")
        host = self.host(model, version)
        contract = self._contracts.get(host)
        if contract is not None:
            requests = _checked(requests, contract)
        with naming(self.replica, proxied=self.proxied):
            async with host.stream(minting(requests, self.replica)) as responses:
                yield responses

    # -- the EngineAPI (typed records; what the transports call) -------------------------

    async def ready(self) -> bool:
        return not self._closing and not self.draining and all(h.ready for h in self.hosts())

    async def models(self) -> list[ModelInfo]:
        return [info(h) for h in self.hosts()]

    async def model_info(self, name: str, version: str | None = None) -> ModelInfo:
        return info(self.host(name, version))

    async def metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        host = self.host(name, version)
        return metadata(host, versions=self._versions(host.name))

    def _versions(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(self._hosts.get(name, ()), key=version_key))

    async def repository_index(self) -> list[RepositoryEntry]:
        scanned = await trio.to_thread.run_sync(self.repository.scan) if self.repository.folders else None
        loaded = [
            RepositoryEntry(h.name, h.version, h.state, h.reason or self.catalog.reason(h.name, h.version))
            for h in self.hosts()
        ]
        return self.catalog.index(loaded, scanned)

    async def statistics(self, name: str, version: str | None = None) -> ModelStatistics:
        return model_statistics(self.host(name, version))

    async def load_from_repository(self, name: str, config: Mapping[str, Any] | None = None) -> None:
        try:
            found = await trio.to_thread.run_sync(self.repository.find, name, self.settings.models)
        except BadInput as exc:  # the model's own settings file is broken
            self.catalog.failed(name, "", exc.message)
            raise
        for model_settings in found:
            try:
                if config is not None:
                    model_settings = self.repository.override(
                        model_settings, config, self.settings.allow_load_overrides
                    )
                await self.load(model_settings)
            except SettingsError as exc:  # e.g. an implementation that cannot be imported
                raise BadInput(str(exc)) from None
            except ModelFailed as exc:  # its load() failed: a 400, as Triton answers a failed load
                raise BadInput(exc.message) from None

    async def load_archive(self, path: str, **overrides: Any) -> ModelInfo:
        settings = await self.repository.archive(path, self.settings.allow_load_overrides, **overrides)
        return info(await self.load(settings))

    async def set_default_version(self, name: str, version: str) -> None:
        self.host(name, version)
        self._defaults.choose(name, version)
        self.watchers.changed()
        log.info("model %s: default version is now %s", name, version)

    async def set_workers(
        self, name: str, workers: int, version: str | None = None, *, grace: float | None = None
    ) -> None:
        host = self.host(name, version)
        before = host.settings.workers
        try:
            await host.set_workers(workers, self.settings.grace_period if grace is None else grace)
        finally:
            self.watchers.changed()
        log.info("model %s version %s: workers %d -> %d", host.name, host.version, before, workers)

    async def describe(self, name: str, version: str | None = None) -> ModelDescription:
        host = self.host(name, version)
        default = self._defaults.of(host.name, self._hosts[host.name])
        return describe(host, default_version=default, versions=self._versions(host.name))

    async def inference_statistics(
        self, name: str = "", version: str | None = None
    ) -> list[InferenceStatistics]:
        if not name:
            hosts = sorted(self.hosts(), key=lambda h: (h.name, version_key(h.version)))
        elif version:
            hosts = [self.host(name, version)]
        else:
            self.host(name)  # ModelNotFound
            hosts = [self._hosts[name][v] for v in self._versions(name)]
        return [inference_statistics(h) for h in hosts]

    async def wait_idle(self) -> None:
        """Return once no request is in flight in any model and no item a caller left
        is still in a batch (woken by the last one leaving; no polling)."""
        await self._inflight.wait_idle()

    async def call(self, request: UnaryCall[T]) -> T:
        """Run a unary method given as its record (:mod:`actorserve.unary`'s table)."""
        return await dispatch(self, request)

    def model(self, name: str, version: str | None = None, *, replica: int = 0) -> Model:
        """The model object serving ``name`` (in-process only: for embedders and tests
        that talk to their own model, e.g. to open a gate). :class:`ModelNotFound`, or
        :class:`ModelNotReady` while it loads."""
        host = self.host(name, version)
        if replica >= len(host.replicas):
            raise ModelNotReady(f"model {host.name!r} has no replica {replica} loaded")
        return host.replicas[replica]

    # -- shutdown -------------------------------------------------------------------------

    async def aclose(self, grace: float | None = None) -> None:
        """Stop accepting, give in-flight requests ``grace`` seconds, then end every
        sequence (reason ``shutdown``) and stop every model."""
        self._closing = True
        grace = self.settings.grace_period if grace is None else grace
        hosts = self.hosts()
        with trio.move_on_after(grace):
            for host in hosts:
                await host.drain(grace)
        for host in hosts:
            host.stop()


if TYPE_CHECKING:  # the in-process engine implements the boundary the transports use
    _conforms: type[EngineAPI] = Engine


async def _checked(
    requests: AsyncIterator[InferenceRequest], contract: RequestContract
) -> AsyncIterator[InferenceRequest]:
    """``requests``, each checked against ``contract`` as it arrives."""
    async for request in requests:
        contract.check(request)
        yield request


@asynccontextmanager
async def open_engine(
    settings: Settings | Iterable[ModelSettings] | None = None,
    *,
    repository: ModelRepository | None = None,
) -> AsyncIterator[Engine]:
    """Load the models of ``settings`` (default: the built-in models) and yield the engine.

    Leaving the block shuts everything down: sequences end with reason ``shutdown`` and
    no task is left behind."""
    if settings is None:
        from ..models import builtin_settings

        settings = Settings(models=tuple(builtin_settings()))
    elif not isinstance(settings, Settings):
        settings = Settings(models=tuple(settings))
    try:
        async with trio.open_nursery() as nursery:
            engine = Engine(nursery, settings, repository)
            try:
                for model_settings in settings.models:
                    host = await engine.load(model_settings)
                    host.loaded_at_startup = True
                if settings.poll_repository > 0 and engine.repository.folders:
                    await nursery.start(poll_repository, engine, engine.repository, settings.poll_repository)
                yield engine
            finally:
                with trio.CancelScope(shield=True):
                    await engine.aclose(grace=0)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The caller's own error (raised in the block) must reach it as itself, not
        # wrapped in the engine's nursery group.
        raise_single(group)
