"""Replica identity without a server: ids that say where they were made, the error for
a sequence a replica does not hold, and the drain's refusal of a start."""

from __future__ import annotations

import re
import socket

import pytest

from actorserve.errors import BadInput, SequenceNotFound, SequenceNotHeld, ShuttingDown
from actorserve.ipc.failures import error_from_plain, error_to_plain
from actorserve.replica import MAX_PREFIX, made_by, mint_id, new_sequence_id, not_held, replica_id
from actorserve.settings import BadSetting, Settings
from actorserve.types import InferenceRequest


def test_server_made_ids_carry_their_replica_and_128_random_bits() -> None:
    sid = new_sequence_id("pod-7.zone")
    assert re.fullmatch(r"pod-7\.zone_[0-9a-f]{32}", sid) and made_by(sid) == "pod-7.zone"
    long = new_sequence_id("x" * 100)
    assert long.startswith("x" * MAX_PREFIX + "_") and made_by(long) == "x" * MAX_PREFIX
    assert re.fullmatch(r"[0-9a-f]{32}", new_sequence_id("")) and made_by("chat-7") is None
    assert made_by("a_b") is None  # a client's id with an underscore is not mistaken for one
    sagemaker = new_sequence_id("pod-7.zone", sagemaker=True)  # SageMaker's session id alphabet
    assert re.fullmatch(r"pod-7-zone--[0-9a-f]{32}", sagemaker) and made_by(sagemaker) == "pod-7-zone"


def test_the_replica_id_defaults_to_the_host_name_made_safe() -> None:
    assert replica_id("r1") == "r1"
    assert replica_id(None) == (
        re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:63].strip("-.") or "replica"
    )
    assert Settings(replica_id="pod-a").replica_id == "pod-a"
    with pytest.raises(BadSetting, match="replica_id must be 1 to 63 letters"):
        Settings(replica_id="bad id")


def test_not_held_names_the_replica_the_id_and_where_it_was_made() -> None:
    error = not_held("r2_" + "0" * 32, "r1")
    assert isinstance(error, SequenceNotHeld) and error.reason == "sequence_not_held"
    assert error.message.startswith(
        f"sequence {'r2_' + '0' * 32!r} is not open on replica 'r1' (unknown id; the id"
    )
    assert "made by replica 'r2'" in error.message
    assert "made by" not in not_held("chat-7", "r1").message
    # its own id: forgotten, or made before a restart
    assert "made by" not in not_held("r1_" + "0" * 32, "r1").message
    # across the engine link it stays itself (the same status, the same reason)
    rebuilt = error_from_plain(*error_to_plain(error))
    assert type(rebuilt) is SequenceNotHeld and rebuilt.message == error.message
    # it says what a proxy routes on
    assert "every request of a sequence must carry its id in the header the proxy routes on" in error.message


def test_a_lone_server_blames_no_proxy() -> None:
    # no --replica-id: an id no other replica made is an unknown sequence, nothing more
    for sid in ("chat-7", "host_" + "0" * 32):
        error = not_held(sid, "host", proxied=False)
        assert type(error) is SequenceNotFound
        assert error.message == (
            f"unknown sequence {sid!r}: it is not open on this server (it never started here, "
            "ended long ago, or the server restarted since); start it with sequence_start"
        )
    # an id another replica made was routed here: that one still blames the routing
    foreign = not_held("r2_" + "0" * 32, "host", proxied=False)
    assert type(foreign) is SequenceNotHeld and "made by replica 'r2'" in foreign.message


def _minted(
    parameters: dict[str, object], replica: str = "r1", *, draining: bool = False
) -> InferenceRequest:
    request = InferenceRequest(inputs=[], parameters=dict(parameters))
    mint_id(request, replica, draining=draining)
    assert request.control is not None
    assert request.control.sequence_id == request.parameters.get("sequence_id")
    return request


def test_mint_id_gives_starts_an_id_and_refuses_them_while_draining() -> None:
    start = _minted({"sequence_start": True})
    assert made_by(str(start.parameters["sequence_id"])) == "r1"
    assert _minted({"sequence_start": "true", "sequence_id": "mine"}).parameters["sequence_id"] == "mine"
    _minted({"sequence_id": "mine"}, draining=True)  # the open sequences go on
    with pytest.raises(ShuttingDown, match="replica 'r1' is draining: start the sequence on another replica"):
        _minted({"sequence_start": True, "sequence_id": "x"}, draining=True)
    with pytest.raises(BadInput):
        _minted({"sequence_start": "maybe"})
    long_id = _minted({"sequence_start": True, "sequence_id": "y" * 300})  # the model's cap decides, later
    assert long_id.parameters["sequence_id"] == "y" * 300
