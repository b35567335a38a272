"""Chat templates: ``messages`` become a model's prompt through the Jinja2 template of
its text-generation declaration (``chat_template``), rendered by
:mod:`actorserve.chattemplate` (sandboxed, as Hugging Face's tokenizers render theirs).

Errors are :class:`OpenAIError` (400): a model without a template, or a template that
fails on these messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...chattemplate import render_messages
from ...errors import BadInput
from .parse import OpenAIError


def render_chat(
    model: str, template: str, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
) -> str:
    """The prompt for ``messages`` (each with ``role`` and ``content``)."""
    if not template:
        raise OpenAIError(
            f"model {model!r} has no chat template (text_generation.chat_template); use /v1/completions",
            param="model",
            code="model_not_supported",
        )
    try:
        return render_messages(template, messages, add_generation_prompt)
    except BadInput as exc:
        raise OpenAIError(f"model {model!r}: {exc.message}", param="messages") from None
