"""Sequence races (issue 14), plain models: a request that starts a sequence without an
id gets the id the server made even when the model answers nothing, as BatchModels do
(``test_rel_sequence_races.py::test_a_start_that_streams_nothing_still_returns_the_server_made_id``).
A plain :class:`Model` whose ``predict_stream`` yields nothing, and one whose
``predict`` returns a response without outputs, over REST (``/infer``, body and
``sequence-id`` header) and gRPC (``ModelInfer``): the client continues and ends the
sequence with the id it was given."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
from support.grpcframes import frame, unframe
from support.rel_badinput import grpc_headers, h2_client, h2_exchange, launch

from actorserve import InferenceRequest, InferenceResponse, Model
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb
from actorserve.server.composition import Server
from actorserve.settings import ModelSettings

TIMEOUT = 10.0


class Silent(Model):
    """``predict_stream`` answers nothing."""

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for _ in requests:
            continue
        return
        yield  # an async generator that yields nothing


class Empty(Model):
    """``predict`` answers a response with no outputs."""

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        return self.response(request, [])


MODELS = (
    ModelSettings(name="silent", implementation=Silent),
    ModelSettings(name="empty", implementation=Empty),
)


async def rest(
    client: httpx.AsyncClient, model: str, rid: str, **parameters: Any
) -> tuple[int, dict[str, Any], str | None]:
    reply = await client.post(
        f"/v2/models/{model}/infer", json={"id": rid, "inputs": [], "parameters": parameters}
    )
    return reply.status_code, reply.json(), reply.headers.get("sequence-id")


async def grpc(
    port: int, model: str, rid: str, **parameters: Any
) -> tuple[str | None, InferenceResponse | None, str]:
    """One ModelInfer on a raw HTTP/2 connection: (grpc-status, response, grpc-message)."""
    message = bytes(
        request_to_pb(InferenceRequest(inputs=[], id=rid, parameters=parameters), model_name=model)
    )
    conn = h2_client()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(port))
    conn.send_data(sid, frame(message), end_stream=True)
    out = await h2_exchange(port, conn)
    response = None
    if out.data:
        ((_, payload),) = unframe(out.data)
        response = response_from_pb(pb.ModelInferResponse.FromString(payload))
    return out.grpc_status, response, out.grpc_message


@pytest.mark.parametrize("model", ["silent", "empty"])
async def test_a_plain_model_answering_nothing_still_returns_the_server_made_id(
    nursery: trio.Nursery, model: str
) -> None:
    server: Server = await launch(nursery, models=MODELS)
    assert server.http_url is not None and server.grpc_address is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as client:
        status, body, header = await rest(client, model, "r1", sequence_start=True)
        assert status == 200, body
        sid = body["parameters"]["sequence_id"]
        assert isinstance(sid, str) and sid and header == sid
        assert (body["id"], body["outputs"]) == ("r1", [])
        status, body, header = await rest(client, model, "r2", sequence_id=sid, sequence_end=True)
        assert (status, body["parameters"]["sequence_id"], header) == (200, sid, sid)
        status, body, _ = await rest(client, model, "r3", sequence_id=sid)
        assert (status, body) == (404, {"error": f"sequence {sid!r} has ended"})

    port = server.grpc_address[1]
    status, response, message = await grpc(port, model, "g1", sequence_start=True)
    assert status == "0", message
    assert response is not None and response.id == "g1" and response.outputs == []
    sid = response.parameters["sequence_id"]
    assert isinstance(sid, str) and sid
    status, response, message = await grpc(port, model, "g2", sequence_id=sid, sequence_end=True)
    assert status == "0", message
    assert response is not None and response.parameters["sequence_id"] == sid
    status, response, message = await grpc(port, model, "g3", sequence_id=sid)
    assert (status, message) == ("5", f"sequence {sid!r} has ended")
