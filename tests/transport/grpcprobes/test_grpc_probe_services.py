"""What reflection lists is what the main gRPC port serves: the services of every
door's handler table, as the gRPC host builds it."""

from __future__ import annotations

import actorserve
from actorserve.metrics import Metrics
from actorserve.server.doors import grpc_doors
from actorserve.settings import Settings
from actorserve.transport.exchange import Recorder
from actorserve.transport.grpchost import GrpcHost
from actorserve.transport.grpcprobes.reflection import SERVED_SERVICES, Descriptors


async def test_reflection_lists_every_service_of_the_doors() -> None:
    settings = Settings(models=(), http_port=None, grpc_port=None)
    async with actorserve.open_engine(settings) as engine:
        table = GrpcHost(settings, Recorder(Metrics(), None)).handlers(grpc_doors(engine, settings))
    served = {path.split("/")[1] for path in table}
    assert served == set(SERVED_SERVICES)
    # and the descriptors know every method of each
    pool = Descriptors().pool
    described = {
        f"/{name}/{method.name}" for name in served for method in pool.FindServiceByName(name).methods
    }
    assert described == set(table)
