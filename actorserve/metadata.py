"""Model metadata as the engine answers it (``GET /v2/models/{name}``): the model's own
``metadata()`` made into :class:`ModelMetadata`, with what the model declares about its
requests in the metadata's ``parameters``.

OIP lets metadata carry ``parameters`` (string, number or boolean values; MLServer
fills them too). Here they say what a client may send beyond the inputs, so that a
generic client (the playground) offers exactly that:

- ``request_parameters``: the names of the request parameters the model reads, joined
  by commas ("" when it reads none). Absent: the model does not declare them and any
  parameter passes.
- ``text_generation.input`` / ``.output`` / ``.max_tokens`` / ``.sampling`` / ``.stop`` /
  ``.usage`` / ``.chat``: the model's text-generation declaration
  (:mod:`actorserve.textgen`; ``sampling`` joined by commas, ``chat`` true when it has a
  chat template). Absent: the model does not generate text.

gRPC's ModelMetadataResponse has no parameters, so only REST shows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .api import ModelMetadata, TensorMetadata
from .settings import ModelSettings
from .textgen import TextGeneration
from .validation import RequestContract

__all__ = ["declared_parameters", "model_metadata", "text_generation_of"]


def text_generation_of(settings: ModelSettings, model_class: type[Any]) -> TextGeneration | None:
    """The model class's declaration with its settings' ``text_generation`` block over it."""
    declared: TextGeneration | None = getattr(model_class, "text_generation", None)
    block = settings.text_generation
    if block is None:
        return declared
    return (declared or TextGeneration()).with_settings(block)


def declared_parameters(settings: ModelSettings, model_class: type[Any]) -> dict[str, str | bool]:
    """The metadata ``parameters`` of a model version (see the module docstring)."""
    parameters: dict[str, str | bool] = {}
    contract = RequestContract.of(settings, model_class)
    if contract is not None and contract.parameters is not None:
        parameters["request_parameters"] = ",".join(sorted(contract.parameters))
    text = text_generation_of(settings, model_class)
    if text is not None:
        parameters.update(
            {
                "text_generation.input": text.input,
                "text_generation.output": text.output,
                "text_generation.max_tokens": text.max_tokens,
                "text_generation.sampling": ",".join(text.sampling),
                "text_generation.stop": text.stop,
                "text_generation.usage": text.usage,
                "text_generation.chat": bool(text.chat_template),
            }
        )
    return parameters


def model_metadata(
    meta: Mapping[str, Any], settings: ModelSettings, model_class: type[Any], versions: tuple[str, ...]
) -> ModelMetadata:
    """:class:`ModelMetadata` from a model's ``metadata()`` dict (a ``parameters`` entry
    there is laid over the declared ones)."""
    specs = (*settings.inputs, *settings.outputs)
    any_datatype = frozenset(s.name for s in specs if s.any_datatype)
    return ModelMetadata(
        name=str(meta.get("name", settings.name)),
        versions=versions,
        platform=str(meta.get("platform", "")),
        inputs=tuple(_tensor_metadata(t, any_datatype) for t in meta.get("inputs", ())),
        outputs=tuple(_tensor_metadata(t, any_datatype) for t in meta.get("outputs", ())),
        parameters={**declared_parameters(settings, model_class), **meta.get("parameters", {})},
    )


def _tensor_metadata(spec: Any, any_datatype: frozenset[str] = frozenset()) -> TensorMetadata:
    name = str(spec["name"])
    return TensorMetadata(
        name, str(spec.get("datatype", "")), tuple(spec.get("shape", ())), name in any_datatype
    )
