"""The log-probabilities of a prompt's own tokens (OpenAI's ``echo`` with ``logprobs``,
which lm-eval's ``loglikelihood`` reads): one forward of the prompt, in chunks, apart
from the request's cache (a request's prefill keeps only its last position's logits)."""

from __future__ import annotations

from typing import Any

import torch

from ...texttokens import TokenLogprob
from .state import LLMWork


def prompt_logprobs(model: Any, tokenizer: Any, work: LLMWork, chunk: int) -> list[TokenLogprob]:
    """Each token of ``work.echo`` with its log-probability given the tokens before it
    (the first has none) and its ``work.logprobs`` likeliest alternatives; clears
    ``work.echo``. The logits held at once are ``chunk`` positions' (not the prompt's)."""
    from transformers import DynamicCache

    ids, work.echo = work.echo or [], None
    k = work.logprobs or 0
    decode = tokenizer.decode
    entries = [TokenLogprob(str(decode([ids[0]])), None)] if ids else []
    device = next(model.parameters()).device
    cache = DynamicCache()
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start : start + chunk]
        positions = torch.arange(start, start + len(piece), device=device).unsqueeze(0)
        out = model(
            input_ids=torch.tensor([piece], device=device),
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        following = ids[start + 1 : start + 1 + len(piece)]  # the token each position predicts
        logprobs = torch.log_softmax(out.logits[0, : len(following)].float(), dim=-1)
        chosen = logprobs.gather(1, torch.tensor(following, device=device).unsqueeze(1)).squeeze(1).tolist()
        top = logprobs.topk(k, dim=-1) if k else None
        values = top.values.tolist() if top is not None else [[] for _ in following]
        indices = top.indices.tolist() if top is not None else [[] for _ in following]
        for token, logprob, alt_ids, alt_values in zip(following, chosen, indices, values, strict=True):
            alternatives = tuple((str(decode([t])), v) for t, v in zip(alt_ids, alt_values, strict=True))
            entries.append(TokenLogprob(str(decode([token])), logprob, alternatives))
    return entries
