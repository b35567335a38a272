"""What a replica says about a sequence it does not hold (docs/deploy.md#stickiness)."""

from __future__ import annotations

from actorserve.replica import not_held, replica_id


def not_held_message(sequence_id: str, replica: str | None = None) -> str:
    """The error text for ``sequence_id`` on the server called ``replica`` (None: a
    server started without ``replica_id``, named after this host)."""
    return not_held(sequence_id, replica_id(replica)).message
