"""A TorchServe handler that answers the names of the request headers it sees."""

import json
from typing import Any


def handle(data: list[Any] | None, context: Any) -> list[str] | None:
    if data is None:  # initialisation
        return None
    return [json.dumps(sorted(context.get_all_request_header(i))) for i in range(len(data))]
