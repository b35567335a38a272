"""The built-in character-level GRU language model (see ``docs/textlm.md``)."""

from __future__ import annotations

from .network import CharGRU, CharVocab, GRUConfig, TextLMCore, generate, load_textlm

__all__ = ["CharGRU", "CharVocab", "GRUConfig", "TextLMCore", "generate", "load_textlm"]
