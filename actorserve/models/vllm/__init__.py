"""``vllm``: the built-in runtime serving a local causal LM with vLLM's engine inside the
engine process, stepped by our batcher (docs/llm.md)."""

from .runtime import VLLMModel

__all__ = ["VLLMModel"]
