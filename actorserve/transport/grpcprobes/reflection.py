"""gRPC server reflection (``grpc.reflection.v1`` and ``v1alpha``, one stream each):
what grpcurl, Postman and grpcui ask a server for its services and their messages.

The descriptors are the ``.proto`` files the main port serves, compiled when the code
is generated (:mod:`actorserve.proto.served_descriptors`, with their imports), and
grpclib's own health and reflection files. A file is answered with every file it
imports (as grpc-go does), so a client needs one round trip per service. Requests
per call are bounded (:data:`MAX_REQUESTS`); an unknown name is answered in-band with
NOT_FOUND, as the protocol says, and the stream goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1 import health_pb2
from grpclib.reflection.v1 import reflection_pb2 as v1
from grpclib.reflection.v1alpha import reflection_pb2 as v1alpha
from grpclib.server import Stream

from ...proto.served_descriptors import FILES
from ...settings import Settings
from ..grpchost.h2 import Wire

#: requests one reflection call may send
MAX_REQUESTS: Final = 1024
#: the reflection services, by package
VERSIONS: Final[dict[str, ModuleType]] = {"grpc.reflection.v1": v1, "grpc.reflection.v1alpha": v1alpha}


def _own_files() -> list[bytes]:
    """grpclib's health and reflection files, serialized."""
    files = []
    for module in (health_pb2, v1, v1alpha):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        files.append(proto.SerializeToString(deterministic=True))
    return files


def _parsed(files: Iterable[bytes]) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    parsed = {}
    for data in files:
        proto = descriptor_pb2.FileDescriptorProto.FromString(data)
        parsed[proto.name] = proto
    return parsed


_FILES: Final = _parsed([*FILES, *_own_files()])
#: every service the main gRPC port serves, by full name (tests/transport/grpcprobes
#: checks this against the doors' handler table)
SERVED_SERVICES: Final = tuple(
    f"{proto.package}.{service.name}" if proto.package else service.name
    for proto in _FILES.values()
    for service in proto.service
)


class Descriptors:
    """The served files in a private descriptor pool (tritonclient registers the same
    ``inference.*`` names in protobuf's default one), answering by file or symbol."""

    def __init__(self) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        self.serialized = {
            name: proto.SerializeToString(deterministic=True) for name, proto in _FILES.items()
        }
        for data in self.serialized.values():  # imports come first in FILES
            self.pool.AddSerializedFile(data)

    def by_name(self, name: str) -> list[bytes] | None:
        """The file ``name`` and every file it imports, transitively (None: unknown)."""
        if name not in _FILES:
            return None
        order: list[str] = []
        todo = [name]
        while todo:  # bounded: each file is taken once, and there are len(_FILES)
            current = todo.pop()
            if current in order or current not in _FILES:
                continue
            order.append(current)
            todo.extend(_FILES[current].dependency)
        return [self.serialized[file] for file in order]

    def by_symbol(self, symbol: str) -> list[bytes] | None:
        """The file defining ``symbol`` (a service, method, message, enum), as :meth:`by_name`."""
        try:
            file = self.pool.FindFileContainingSymbol(symbol)
        except KeyError:
            return None
        return self.by_name(file.name)


class ReflectionService:
    """The handlers of both reflection services (open: no token)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.descriptors = Descriptors()

    def __mapping__(self) -> dict[str, Handler]:
        return {
            f"/{package}.ServerReflection/ServerReflectionInfo": Handler(
                self._handler(module),
                Cardinality.STREAM_STREAM,
                module.ServerReflectionRequest,
                module.ServerReflectionResponse,
            )
            for package, module in VERSIONS.items()
        }

    def _handler(self, module: ModuleType) -> Any:
        async def info(stream: Stream[Any, Any]) -> None:
            wire = Wire(
                stream,
                module.ServerReflectionRequest,
                max_bytes=self.settings.max_body_bytes,
                min_bytes=self.settings.gzip_min_bytes,
            )
            for _ in range(MAX_REQUESTS):
                request = await wire.recv()
                if request is None:
                    return
                await wire.send(self.answer(module, request))
            raise GRPCError(Status.RESOURCE_EXHAUSTED, f"more than {MAX_REQUESTS} requests on one call")

        return info

    def answer(self, module: ModuleType, request: Any) -> Any:
        """The response to one ``ServerReflectionRequest`` of ``module`` (v1 or v1alpha)."""
        kind = request.WhichOneof("message_request")
        response = module.ServerReflectionResponse(valid_host=request.host, original_request=request)
        files: list[bytes] | None = None
        if kind == "list_services":
            response.list_services_response.service.extend(
                module.ServiceResponse(name=name) for name in SERVED_SERVICES
            )
            return response
        if kind == "file_by_filename":
            files = self.descriptors.by_name(request.file_by_filename)
        elif kind == "file_containing_symbol":
            files = self.descriptors.by_symbol(request.file_containing_symbol)
        elif kind == "all_extension_numbers_of_type":  # proto3 files: a known type has none
            name = request.all_extension_numbers_of_type
            if self.descriptors.by_symbol(name) is not None:
                response.all_extension_numbers_response.base_type_name = name
                return response
        elif kind == "file_containing_extension":
            files = None  # proto3 files: no extensions to find
        else:
            response.error_response.error_code = Status.INVALID_ARGUMENT.value
            response.error_response.error_message = "the request names no question"
            return response
        if files is None:
            response.error_response.error_code = Status.NOT_FOUND.value
            response.error_response.error_message = f"{kind} not found"
            return response
        response.file_descriptor_response.file_descriptor_proto.extend(files)
        return response


__all__ = ["MAX_REQUESTS", "SERVED_SERVICES", "Descriptors", "ReflectionService"]
