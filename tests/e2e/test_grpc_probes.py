"""gRPC health checking (``grpc.health.v1.Health``) and server reflection on the main
gRPC port of a real server on 127.0.0.1 port 0, asked by ``grpcio`` (what Kubernetes'
gRPC probes, Envoy and grpcurl speak) with grpclib's own protobuf messages, by path."""

from __future__ import annotations

import queue
from typing import Any

import grpc
import pytest
import trio
import trio.testing
from e2e.grpc_fixtures import in_thread, running_grpc_server, wait_until
from google.protobuf import descriptor_pb2, descriptor_pool
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.reflection.v1 import reflection_pb2 as v1
from grpclib.reflection.v1alpha import reflection_pb2 as v1alpha

from actorserve import InferenceRequest, InferenceResponse, Model, ModelSettings
from actorserve.transport.grpcprobes import health, reflection

TIMEOUT = 20.0
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
SERVICES = {
    "inference.GRPCInferenceService",
    "actorserve.v1.Management",
    "org.pytorch.serve.grpc.inference.InferenceAPIsService",
    "org.pytorch.serve.grpc.management.ManagementAPIsService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}


def check(target: str, service: str) -> str:
    """Check's answer: the status's name, or the gRPC error's code and message."""
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            CHECK,
            request_serializer=HealthCheckRequest.SerializeToString,
            response_deserializer=HealthCheckResponse.FromString,
        )
        try:
            reply = call(HealthCheckRequest(service=service), timeout=TIMEOUT)
        except grpc.RpcError as exc:
            return f"{exc.code().name} {exc.details()}"
        return str(HealthCheckResponse.ServingStatus.Name(reply.status))


class Watcher:
    """One Watch call in a client thread; its statuses by name in ``seen``."""

    def __init__(self, target: str, service: str) -> None:
        self.channel = grpc.insecure_channel(target)
        watch = self.channel.unary_stream(
            WATCH,
            request_serializer=HealthCheckRequest.SerializeToString,
            response_deserializer=HealthCheckResponse.FromString,
        )
        self.call: Any = watch(HealthCheckRequest(service=service), timeout=60)
        self.seen: queue.Queue[str] = queue.Queue()

    def read(self) -> None:
        try:
            for reply in self.call:
                self.seen.put(HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.RpcError as exc:
            self.seen.put(exc.code().name)

    async def next(self) -> str:
        return await in_thread(lambda: self.seen.get(timeout=TIMEOUT))

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


async def test_check_answers_for_the_server_its_services_and_each_model() -> None:
    async with running_grpc_server() as server:
        answers = await in_thread(
            lambda: [
                check(server.target, name)
                for name in ("", "inference.GRPCInferenceService", "accumulator", "identity", "nope")
            ]
        )
        assert answers == [
            "SERVING",
            "SERVING",
            "SERVING",
            "SERVING",
            "NOT_FOUND unknown service 'nope': name '' (the server), a gRPC service this port "
            "serves, or a loaded model",
        ]


class SlowLoad(Model):
    """A model whose load waits for the test (``release``)."""

    release: trio.Event

    async def load(self) -> None:
        await SlowLoad.release.wait()

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        return self.response(request, [])


async def test_a_model_loading_is_not_serving_and_so_is_the_server() -> None:
    SlowLoad.release = trio.Event()
    async with running_grpc_server() as server, trio.open_nursery() as nursery:
        nursery.start_soon(server.engine.load, ModelSettings(name="slow", implementation=SlowLoad))
        await wait_until(lambda: "slow" in {m.name for m in server.engine.hosts()})
        loading = await in_thread(lambda: [check(server.target, "slow"), check(server.target, "")])
        SlowLoad.release.set()
        await wait_until(lambda: all(h.ready for h in server.engine.hosts()))
        loaded = await in_thread(lambda: [check(server.target, "slow"), check(server.target, "")])
    assert (loading, loaded) == (["NOT_SERVING", "NOT_SERVING"], ["SERVING", "SERVING"])


async def test_watch_calls_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "MAX_WATCHES", 1)
    async with running_grpc_server() as server, trio.open_nursery() as nursery:
        first = Watcher(server.target, "")  # grpcio starts the call here
        second: Watcher | None = None
        try:
            nursery.start_soon(trio.to_thread.run_sync, first.read)
            assert await first.next() == "SERVING"
            second = Watcher(server.target, "")
            nursery.start_soon(trio.to_thread.run_sync, second.read)
            assert await second.next() == "RESOURCE_EXHAUSTED"
        finally:
            first.close()
            if second is not None:
                second.close()


async def test_watch_follows_a_model_and_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "WATCH_INTERVAL", 0.05)
    async with running_grpc_server() as server, trio.open_nursery() as nursery:
        model, overall = Watcher(server.target, "accumulator"), Watcher(server.target, "")
        try:
            nursery.start_soon(trio.to_thread.run_sync, model.read)
            nursery.start_soon(trio.to_thread.run_sync, overall.read)
            assert await model.next() == "SERVING"
            assert await overall.next() == "SERVING"
            await server.engine.unload("accumulator")
            assert await model.next() == "SERVICE_UNKNOWN"  # the call goes on: it may come back
            # the drain: a call in flight keeps the server draining while probes ask
            gate = server.model("gate")
            nursery.start_soon(in_thread, lambda: _infer_gate(server.target))
            with trio.fail_after(TIMEOUT):
                await gate.started["inflight"].wait()
            server.scope.cancel()
            assert await overall.next() == "NOT_SERVING"
            assert await in_thread(lambda: check(server.target, "")) == "NOT_SERVING"
            assert await in_thread(lambda: check(server.target, "identity")) == "NOT_SERVING"
            gate.gates["g"].set()
        finally:
            model.close()
            overall.close()


def _infer_gate(target: str) -> None:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(target) as c:
        c.infer("gate", [], request_id="inflight", parameters={"gate": "g"}, client_timeout=TIMEOUT)


def reflect(target: str, module: Any, requests: list[Any]) -> list[Any]:
    """One ServerReflectionInfo call of ``module`` (v1 or v1alpha) asking ``requests``."""
    package = module.DESCRIPTOR.package
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            f"/{package}.ServerReflection/ServerReflectionInfo",
            request_serializer=module.ServerReflectionRequest.SerializeToString,
            response_deserializer=module.ServerReflectionResponse.FromString,
        )
        return list(call(iter(requests), timeout=TIMEOUT))


async def test_reflection_calls_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflection, "MAX_REQUESTS", 2)
    ask = v1.ServerReflectionRequest(list_services="")
    async with running_grpc_server() as server:

        def three() -> tuple[int, str]:
            with pytest.raises(grpc.RpcError) as info:
                reflect(server.target, v1, [ask, ask, ask])
            return info.value.code(), info.value.details()

        assert await in_thread(three) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "more than 2 requests on one call",
        )


@pytest.mark.parametrize("module", [v1, v1alpha])
async def test_reflection_lists_and_describes_every_service(module: Any) -> None:
    ask = module.ServerReflectionRequest
    async with running_grpc_server(no_auth=False, token="s3cret") as server:  # open, too
        listed, by_symbol, by_name, unknown = await in_thread(
            lambda: reflect(
                server.target,
                module,
                [
                    ask(list_services=""),
                    ask(file_containing_symbol="org.pytorch.serve.grpc.inference.InferenceAPIsService"),
                    ask(file_by_filename="grpc_service.proto"),
                    ask(file_containing_symbol="no.such.Service"),
                ],
            )
        )
    assert {s.name for s in listed.list_services_response.service} == SERVICES
    # a file comes with its imports: a fresh pool builds the service from the answer alone
    pool = descriptor_pool.DescriptorPool()
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(f)
        for f in by_symbol.file_descriptor_response.file_descriptor_proto
    ]
    assert [f.name for f in files] == [
        "torchserve/inference.proto",
        "google/rpc/status.proto",
        "google/protobuf/any.proto",
        "google/protobuf/empty.proto",
    ]
    for file in reversed(files):
        pool.Add(file)
    service = pool.FindServiceByName("org.pytorch.serve.grpc.inference.InferenceAPIsService")
    assert [m.name for m in service.methods] == [
        "Ping",
        "Predictions",
        "StreamPredictions",
        "StreamPredictions2",
    ]
    (triton,) = by_name.file_descriptor_response.file_descriptor_proto
    proto = descriptor_pb2.FileDescriptorProto.FromString(triton)
    assert "ModelStreamInfer" in [m.name for m in proto.service[0].method]
    assert (unknown.error_response.error_code, unknown.error_response.error_message) == (
        grpc.StatusCode.NOT_FOUND.value[0],
        "file_containing_symbol not found",
    )
