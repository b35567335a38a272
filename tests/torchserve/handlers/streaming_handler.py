"""TorchServe's streaming style: a module-level handle() that sends intermediate
responses with send_intermediate_predict_response and returns the last one."""

import logging

from ts.handler_utils.utils import send_intermediate_predict_response

log = logging.getLogger(__name__)
words = {}


def handle(data, context):
    if data is None:  # TorchServe's initialize call: handle(None, context)
        words["prefix"] = context.model_yaml_config.get("handler", {}).get("prefix", "")
        return None
    texts = []
    for row in data:
        value = row.get("data") or row.get("body")
        texts.append(value.decode() if isinstance(value, (bytes, bytearray)) else str(value))
    for step in range(3):
        send_intermediate_predict_response(
            [f"{words['prefix']}{text}:{step}" for text in texts],
            context.request_ids,
            "Intermediate Prediction success",
            200,
            context,
        )
    return [f"{words['prefix']}{text}:done" for text in texts]
