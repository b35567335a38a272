"""What a replica says about a sequence it does not hold (docs/deploy.md#stickiness)."""

from __future__ import annotations

from actorserve.replica import not_held, replica_id


def not_held_message(sequence_id: str, replica: str | None = None) -> str:
    """The error text for ``sequence_id`` on the server called ``replica`` (None: a
    lone server, started without ``replica_id`` and named after this host, which
    blames no proxy: "unknown sequence")."""
    return not_held(sequence_id, replica_id(replica), proxied=replica is not None).message


def routing_hint(sequence_id: str) -> str:
    """What a gRPC not-held error adds when the call carried no ``sequence-id`` metadata."""
    headers = f"headers={{'sequence-id': '{sequence_id}'}}"
    return (
        "; this call carried no 'sequence-id' metadata, which the proxy routes on: send it on every "
        f"call of the sequence (tritonclient: infer(..., {headers}) or start_stream(..., {headers}))"
    )
