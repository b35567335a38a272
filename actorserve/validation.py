"""Checking a request against what its model declares: input names, datatypes and
shapes, and request parameter names.

Pure code, no I/O: the engine builds one :class:`RequestContract` per loaded model
version (:meth:`RequestContract.of`) and calls :meth:`RequestContract.check` once per
request, before the model sees it. Every refusal is a :class:`BadInput` that says what
was expected. What a model does not declare is not checked: a model without ``inputs``
takes any inputs, one without declared parameters takes any parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from .controls import control_of
from .errors import BadInput, shorten
from .settings import ModelSettings, TensorSpec
from .types import SEQUENCE_PARAMETERS, InferenceRequest

#: unknown parameter names an error lists (the rest are counted)
MAX_LISTED: Final = 20

#: Request parameters read by the engine or by a transport or client library, never by
#: the model: never unknown. (Triton's binary-data and scheduling parameters, MLServer's
#: ``content_type`` / ``headers``, TorchServe's ``ts_headers``, the sequence controls.)
#: Those the server acts on are also read once into the request's
#: :class:`~actorserve.controls.RequestControl` (sequence, owner, priority, timeout).
RESERVED_PARAMETERS: Final = SEQUENCE_PARAMETERS | frozenset(
    {
        "binary_data",
        "binary_data_output",
        "binary_data_size",
        "priority",
        "timeout",
        "triton_enable_empty_final_response",
        "content_type",
        "headers",
        "ts_headers",  # TorchServe's request headers (torchserve.envelope.HEADERS)
    }
)


def _shape_text(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _shape_matches(declared: tuple[int, ...], got: tuple[int, ...]) -> bool:
    if len(declared) != len(got):
        return False
    return all(d == -1 or d == g for d, g in zip(declared, got, strict=True))


@attrs.frozen(slots=True)
class RequestContract:
    """What one model version accepts. Build it with :meth:`of` (None when the model
    declares nothing, so the engine skips the check)."""

    model: str
    #: declared inputs by name; empty: any inputs
    inputs: Mapping[str, TensorSpec] = attrs.field(factory=dict)
    #: names of the inputs a request must carry
    required: tuple[str, ...] = ()
    #: parameter names the model reads; None: any parameter
    parameters: frozenset[str] | None = None
    #: ``parameters`` and :data:`RESERVED_PARAMETERS` (one subset test per request)
    allowed: frozenset[str] = attrs.field(init=False)

    @allowed.default
    def _allowed(self) -> frozenset[str]:
        return (self.parameters or frozenset()) | RESERVED_PARAMETERS

    @classmethod
    def of(cls, settings: ModelSettings, model_class: type[Any]) -> RequestContract | None:
        """The contract of a model version: its settings' ``inputs`` and the union of the
        class's ``request_parameters`` and the settings' ``request.parameters``."""
        declared: frozenset[str] | None = getattr(model_class, "request_parameters", None)
        if settings.request_parameters is not None:
            declared = settings.request_parameters | (declared or frozenset())
        if not settings.inputs and declared is None:
            return None
        return cls(
            model=settings.name,
            inputs={spec.name: spec for spec in settings.inputs},
            required=tuple(spec.name for spec in settings.inputs if not spec.optional),
            parameters=None if declared is None else frozenset(declared),
        )

    def check(self, request: InferenceRequest) -> None:
        """Raise :class:`BadInput` if ``request`` does not fit; return None if it does."""
        params = request.parameters
        if self.parameters is not None and params and not params.keys() <= self.allowed:
            self._check_parameters(params)
        # a sequence_cancel request carries no inputs (its sequence's own request does)
        if self.inputs and not control_of(request).cancel:
            self._check_inputs(request)

    def _check_parameters(self, params: Mapping[str, Any]) -> None:
        known = self.parameters
        assert known is not None
        unknown = [k for k in params if k not in known and k not in RESERVED_PARAMETERS]
        if unknown:
            names = ", ".join(sorted(known)) or "none"
            listed = shorten(", ".join(repr(shorten(k, 100)) for k in unknown[:MAX_LISTED]), 1024)
            if len(unknown) > MAX_LISTED:
                listed += f" and {len(unknown) - MAX_LISTED} more"
            noun = "parameter" if len(unknown) == 1 else "parameters"
            raise BadInput(f"model {self.model!r} has no {noun} {listed}; its parameters are: {names}")

    def _check_inputs(self, request: InferenceRequest) -> None:
        seen: set[str] = set()
        for tensor in request.inputs:
            name = tensor.name
            spec = self.inputs.get(name)
            if spec is None:
                raise BadInput(
                    f"model {self.model!r} has no input {name!r} (expected {', '.join(self.inputs)})"
                )
            if name in seen:
                raise BadInput(f"input {name!r} of model {self.model!r} is given twice")
            seen.add(name)
            if spec.any_datatype:
                continue
            if tensor.datatype != spec.datatype:
                raise BadInput(
                    f"input {name!r} of model {self.model!r}: expected {spec.datatype}, got {tensor.datatype}"
                )
            if spec.shape != tensor.shape and not _shape_matches(spec.shape, tensor.shape):
                raise BadInput(
                    f"input {name!r} of model {self.model!r}: expected shape {_shape_text(spec.shape)} "
                    f"(-1: any size), got {_shape_text(tensor.shape)}"
                )
        if len(seen) < len(self.inputs):  # some declared input is absent: a required one?
            missing = [n for n in self.required if n not in seen]
            if missing:
                noun = "input" if len(missing) == 1 else "inputs"
                raise BadInput(f"missing required {noun} {', '.join(repr(n) for n in missing)}")


__all__ = ["RESERVED_PARAMETERS", "RequestContract"]
