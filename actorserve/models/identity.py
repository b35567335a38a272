"""``identity``: outputs equal to inputs (INPUT0 -> OUTPUT0, INPUT1 -> OUTPUT1)."""

from __future__ import annotations

from ..errors import BadInput
from ..model import Model
from ..types import InferenceRequest, InferenceResponse, Tensor

_PAIRS = {"INPUT0": "OUTPUT0", "INPUT1": "OUTPUT1"}


class IdentityModel(Model):
    """Inputs ``INPUT0`` (required) and ``INPUT1`` (optional), any datatype and shape.

    Requested ``outputs`` are honoured (an unknown one is an error) and the request's
    non-sequence parameters are echoed in the response parameters.
    """

    async def predict(self, request: InferenceRequest) -> InferenceResponse:
        outputs: dict[str, Tensor] = {}
        for tensor in request.inputs:
            out_name = _PAIRS.get(tensor.name)
            if out_name is None:
                raise BadInput(f"model {self.name!r} has no input {tensor.name!r} (expected INPUT0, INPUT1)")
            outputs[out_name] = tensor.renamed(out_name)  # packed BYTES stay packed
        if "OUTPUT0" not in outputs:
            raise BadInput("missing required input 'INPUT0'")
        if request.outputs:
            selected = []
            for wanted in request.outputs:
                if wanted.name not in _PAIRS.values():
                    raise BadInput(
                        f"unknown requested output {wanted.name!r} (model {self.name!r} has OUTPUT0, OUTPUT1)"
                    )
                if wanted.name not in outputs:
                    raise BadInput(f"requested output {wanted.name!r} needs input 'INPUT1'")
                selected.append(outputs[wanted.name])
            result = selected
        else:
            result = list(outputs.values())
        return self.response(request, result, request.model_parameters())
