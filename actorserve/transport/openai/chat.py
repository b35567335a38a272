"""Chat templates: ``messages`` become a model's prompt through the Jinja2 template of
its text-generation declaration (``chat_template``), rendered in Jinja2's sandbox as
Hugging Face's tokenizers render theirs (``messages``, ``add_generation_prompt``,
``raise_exception``).

A template is compiled once per distinct text. Errors are :class:`OpenAIError` (400):
a model without a template, or a template that fails on these messages.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .parse import OpenAIError

_ENVIRONMENT = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> jinja2.Template:
    return _ENVIRONMENT.from_string(source)


def _raise_exception(message: str) -> None:
    """``raise_exception(message)``, which Hugging Face's templates call on messages they
    refuse (as ``transformers`` provides it): the render fails with that message."""
    raise jinja2.TemplateError(message)


def render_chat(model: str, template: str, messages: Sequence[Mapping[str, str]]) -> str:
    """The prompt for ``messages`` (each with ``role`` and ``content``)."""
    if not template:
        raise OpenAIError(
            f"model {model!r} has no chat template (text_generation.chat_template); use /v1/completions",
            param="model",
            code="model_not_supported",
        )
    try:
        return _compiled(template).render(
            messages=[dict(m) for m in messages], add_generation_prompt=True, raise_exception=_raise_exception
        )
    except jinja2.TemplateError as exc:
        raise OpenAIError(
            f"model {model!r}: its chat template failed on these messages: {exc}", param="messages"
        ) from None
