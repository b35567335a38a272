"""Tiny causal-LM checkpoints built at test time (no downloads): a byte-level BPE
tokenizer trained on Shakespeare and a 2-layer GPT-2 or Llama with random weights drawn
wide enough that greedy choices are not near ties, saved as a model folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

#: the tokenizer's training text, shipped with the tests (tests/data/README.md says whence)
DATA = Path(__file__).resolve().parents[1] / "data" / "tinyshakespeare.txt"
SPECIAL = "<|endoftext|>"
#: a chat template as checkpoints ship them (using bos_token, raise_exception)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def training_text() -> str:
    """The tokenizer's training text; a missing file is an error, never another text."""
    if not DATA.is_file():
        raise FileNotFoundError(f"{DATA} is missing: it ships with the repository (tests/data/README.md)")
    return DATA.read_text()[:200_000]


def tokenizer(vocab_size: int = 400) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # no fallback text: the tests' exact expectations depend on this tokenizer
    text = training_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[SPECIAL], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text[i : i + 4096] for i in range(0, len(text), 4096)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(
    folder: Path,
    arch: str = "gpt2",
    *,
    width: int = 64,
    layers: int = 2,
    seed: int = 0,
    std: float = 0.3,
    vocab_size: int = 400,
    context: int = 256,
    dtype: str | None = None,
) -> Path:
    """Save a ``transformers`` checkpoint and a model-settings.json into ``folder`` (its
    ``dtype`` parameter when given; the runtime's default otherwise)."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    tok = tokenizer(vocab_size)
    eos = tok.eos_token_id
    config: Any
    if arch == "gpt2":
        config = GPT2Config(
            vocab_size=len(tok),
            n_positions=context,
            n_embd=width,
            n_layer=layers,
            n_head=4,
            bos_token_id=eos,
            eos_token_id=eos,
        )
    else:
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=context,
            bos_token_id=eos,
            eos_token_id=eos,
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, std)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    settings: dict[str, Any] = {"name": folder.name, "implementation": "transformers"}
    if dtype is not None:
        settings["parameters"] = {"dtype": dtype}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder


class Oracle:
    """``transformers``' own greedy generation of a checkpoint (on ``device``)."""

    def __init__(self, folder: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device)
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
        self.model = model.to(self.device).eval()
        self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)

    def text(self, prompt: str, max_tokens: int) -> str:
        """The greedy continuation of ``prompt`` as the runtime streams it (EOS not shown)."""
        ids = self.tok(prompt, return_tensors="pt").input_ids.to(self.device)
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
            )
        prompt_ids, new = ids[0].tolist(), out[0, ids.shape[1] :].tolist()
        if new and new[-1] == self.tok.eos_token_id:
            new = new[:-1]
        decode = self.tok.decode
        whole = str(decode(prompt_ids + new, skip_special_tokens=True))
        return whole[len(decode(prompt_ids, skip_special_tokens=True)) :]
