"""Chat templates rendered as Hugging Face's tokenizers render theirs: a Jinja2 template
turning ``messages`` into a prompt, in Jinja2's sandbox, with ``messages``,
``add_generation_prompt`` and ``raise_exception``. Used by the OpenAI door (a request's
messages) and by a model that renders its sequence's whole conversation itself
(``TextGeneration.chat_history``).

A template is compiled once per distinct text. A template that fails on the messages is
:class:`~actorserve.errors.BadInput` with its message.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import BadInput

_ENVIRONMENT = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> jinja2.Template:
    return _ENVIRONMENT.from_string(source)


def _raise_exception(message: str) -> None:
    """``raise_exception(message)``, which Hugging Face's templates call on messages they
    refuse (as ``transformers`` provides it): the render fails with that message."""
    raise jinja2.TemplateError(message)


def render_messages(
    template: str, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
) -> str:
    """The prompt for ``messages`` (each with ``role`` and ``content``); :class:`BadInput`
    naming the template's error when it fails on them."""
    try:
        return _compiled(template).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            raise_exception=_raise_exception,
        )
    except jinja2.TemplateError as exc:
        raise BadInput(f"its chat template failed on these messages: {exc}") from None
