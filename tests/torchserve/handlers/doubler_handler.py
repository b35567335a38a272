"""A TorchServe handler as its users write them: a BaseHandler subclass that lets
BaseHandler load the eager model (model file + state dict) and batches JSON lists."""

import json

import torch
from ts.torch_handler.base_handler import BaseHandler


class DoublerHandler(BaseHandler):
    def preprocess(self, data):
        rows = []
        for idx, row in enumerate(data):
            value = row.get("data") or row.get("body")
            if isinstance(value, (bytes, bytearray)):
                value = json.loads(value)
            rows.append(torch.tensor(value, dtype=torch.float32))
            self.context.set_response_header(idx, "x-batch-size", str(len(data)))
        return torch.stack(rows)

    def postprocess(self, data):
        return [{"doubled": row.tolist()} for row in data]
