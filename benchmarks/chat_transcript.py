"""A chat as the benchmarks send it (``llm_chat_turns.py``, ``vllm_compare.py``): a system
line, user turns of Shakespeare, greedy answers, and what each turn sends: the whole
conversation so far (as every OpenAI chat client resends it) or, to a sequence that keeps
the rest in the server, only the new turn. Both ways put the same text before the model,
so a greedy model answers both alike. Not a test; imported by the scripts beside it (the
folder of the script run is on ``sys.path``)."""

from __future__ import annotations

from typing import Any

from support.tiny_llm import DATA

SYSTEM = "system: You are a player in a company of actors. Answer in verse.\n"


def user_turns(tokenizer: Any, turns: int, new: int) -> list[str]:
    """``turns`` passages of about ``new`` tokens each, one per turn."""
    ids: list[int] = tokenizer(DATA.read_text()[:200_000])["input_ids"]
    step = max(new, (len(ids) - new) // max(1, turns))
    return [str(tokenizer.decode(ids[i * step : i * step + new - 6])) for i in range(turns)]


class Transcript:
    """One way of sending the chat (``sequence`` or resent) and the conversation so far.

    Call :meth:`prompt` for a turn's text to send, then :meth:`answered` with what the
    model said, turn after turn. ``system`` opens the conversation: two ways sent to one
    server with the same ``system`` read the same tokens (and share its prefix cache)."""

    def __init__(self, sequence: bool, system: str = SYSTEM) -> None:
        self.sequence = sequence
        self.history = system
        self.answers: list[str] = []

    def prompt(self, text: str) -> str:
        """What the next turn sends: the history and the new turn, or to a sequence only
        the new turn (its first turn with the system line: the server keeps the rest)."""
        new = f"user: {text}\nassistant:"
        if not self.sequence:
            return self.history + new
        return (self.history if not self.answers else "\n") + new

    def answered(self, text: str, said: str) -> None:
        """Record the turn ``text`` and the model's answer ``said``."""
        self.history += f"user: {text}\nassistant:{said}\n"
        self.answers.append(said)
