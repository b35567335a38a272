"""Where a ``transformers`` checkpoint is, and the chat template of its tokenizer (read
before the model loads: the OpenAI routes learn it from the model's declaration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...modelsettings import ModelSettings


def source_of(settings: ModelSettings) -> str:
    """Where the checkpoint is: ``parameters.uri`` relative to the model folder (default
    the folder itself); a string that is no existing path is a hub id of the local cache."""
    uri = str(settings.parameters.get("uri", "") or "")
    base = Path(settings.folder) if settings.folder is not None else Path.cwd()
    path = base / uri if uri else base
    if path.exists() or not uri:
        return str(path)
    return uri


def chat_template(folder: Path) -> str:
    """The tokenizer's chat template in ``folder`` ("" if none), made to render with
    ``messages`` and ``add_generation_prompt`` alone: ``bos_token`` / ``eos_token`` are set
    from the tokenizer's config (``raise_exception`` is the chat route's)."""
    template = ""
    config: dict[str, Any] = {}
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        jinja = folder / "chat_template.jinja"
        template = jinja.read_text() if jinja.is_file() else config.get("chat_template") or ""
    except (OSError, ValueError):
        return ""
    if not isinstance(template, str) or not template:
        return ""
    header = "".join(
        f"{{% set {name} = {json.dumps(_token_text(config.get(name)))} %}}"
        for name in ("bos_token", "eos_token")
    )
    return header + template


def _token_text(token: Any) -> str:
    if isinstance(token, dict):
        return str(token.get("content", ""))
    return str(token) if token is not None else ""
