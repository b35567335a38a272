"""What a model declares about its requests, as its metadata shows it
(``GET /v2/models/{name}``, built by :func:`actorserve.actors.reports.metadata`): the
request parameters it reads and its text-generation declaration, in the metadata's
``parameters``.

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

from typing import Any

from .settings import ModelSettings
from .textgen import TextGeneration
from .validation import RequestContract

__all__ = ["declared_parameters", "text_generation_of"]


def text_generation_of(settings: ModelSettings, model_class: type[Any]) -> TextGeneration | None:
    """The model class's declaration with its settings' ``text_generation`` block over it.

    A class may derive its declaration from its settings (a classmethod
    ``declare_text_generation(settings)``: the transformers runtime reads the chat
    template of the checkpoint's tokenizer)."""
    hook = getattr(model_class, "declare_text_generation", None)
    declared: TextGeneration | None = (
        hook(settings) if hook is not None else getattr(model_class, "text_generation", None)
    )
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
