"""``transformers``: the built-in runtime serving any causal LM that ``transformers`` loads
from a local folder, with continuous batching and a KV cache per sequence (docs/llm.md)."""

from .runtime import TransformersModel

__all__ = ["TransformersModel"]
