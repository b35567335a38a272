"""Train the built-in character GRU.

    python -m actorserve.models.textlm.train PATH_TO_TEXT [--out DIR] [--minutes N] [--seed S]

The last 10% of the text is the validation split. Training is truncated BPTT over
``--batch`` contiguous streams of the training split (the hidden state is carried from one
``--seq-len`` window to the next and reset at each epoch, whose start is shifted at random),
Adam with a linear warm-up and a cosine decay to 10% of ``--lr``, and gradient clipping.

Without ``--steps`` the run lasts ``--minutes`` and the learning-rate schedule follows the
elapsed time; with ``--steps`` it follows the step count (and the run is reproducible for a
given seed and thread count). The weights are written as ``weights.safetensors`` (float16
unless ``--dtype fp32``) and the vocabulary and network shape as ``vocab.json`` in ``--out``
(default: this package's folder). At the end the script prints the validation loss of the
GRU and of a unigram model, and a sample at temperature 0.8.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm  # type: ignore[import-untyped]

from .network import (
    PACKAGE_DIR,
    VOCAB_FILE,
    WEIGHTS_FILE,
    CharGRU,
    CharVocab,
    GRUConfig,
    TextLMCore,
    generate,
    load_textlm,
)

IntArray = np.ndarray[Any, np.dtype[np.int64]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m actorserve.models.textlm.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("text", type=Path, help="training text (UTF-8); the last 10%% is validation")
    p.add_argument("--out", type=Path, default=PACKAGE_DIR, help="output folder (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=12.0, help="time budget (default: %(default)s)")
    p.add_argument("--steps", type=int, default=0, help="fixed number of steps instead of a time budget")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default: %(default)s; 2 is faster on an idle 2-core machine, far slower on a busy one)",
    )
    p.add_argument("--embedding-size", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.0, help="between GRU layers, training only")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16", help="stored weights")
    return p.parse_args(argv)


def unigram_loss(train: IntArray, val: IntArray, vocab_size: int) -> float:
    """Cross-entropy (nats/char) on ``val`` of the train split's character frequencies
    (add-one smoothed so that characters unseen in training have a finite cost)."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val].mean())


def evaluate(model: CharGRU, ids: IntArray, n_streams: int = 16, chunk: int = 256) -> float:
    """Mean cross-entropy (nats/char) over ``ids``, cut into ``n_streams`` contiguous streams
    each read from a zero state with the state carried across ``chunk``-long windows."""
    was_training = model.training
    model.eval()
    n = (len(ids) // n_streams) * n_streams
    data = torch.from_numpy(ids[:n].reshape(n_streams, -1))
    total, count = 0.0, 0
    with torch.inference_mode():
        h: torch.Tensor | None = None
        for start in range(0, data.shape[1] - 1, chunk):
            x = data[:, start : start + chunk]
            y = data[:, start + 1 : start + chunk + 1]
            x = x[:, : y.shape[1]]
            logits, h = model(x, h)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += y.numel()
    model.train(was_training)
    return total / count


def lr_at(progress: float, step: int, base: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``base`` to ``base / 10``."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(max(progress, 0.0), 1.0)
    return base * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    text = args.text.read_text(encoding="utf-8")
    vocab = CharVocab.from_text(text)
    ids = vocab.encode_array(text)
    n_val = len(ids) // 10
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    print(f"{len(text):,} chars, vocabulary {vocab.size}, train {len(train_ids):,}, val {len(val_ids):,}")

    config = GRUConfig(vocab.size, args.embedding_size, args.hidden_size, args.layers)
    model = CharGRU(config, dropout=args.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"CharGRU E={config.embedding_size} H={config.hidden_size} L={config.num_layers}: {n_params:,} params"
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    batch, seq_len = args.batch, args.seq_len
    stream_len = len(train_ids) // batch - seq_len  # room for the random epoch shift
    windows_per_epoch = (stream_len - 1) // seq_len
    budget = args.minutes * 60.0
    fixed_steps = args.steps > 0
    eval_every = max(1, (args.steps if fixed_steps else 10**9) // 10)
    next_eval_at = 0.1  # progress fraction of the next quick validation (time-budget mode)
    quick_val = val_ids[:32_768]

    model.train()
    t0 = time.perf_counter()
    step, epoch, smooth = 0, 0, float("nan")
    bar = tqdm(total=args.steps if fixed_steps else None, unit="step", dynamic_ncols=True)
    done = False
    while not done:
        shift = int(rng.integers(0, seq_len))
        data = torch.from_numpy(
            train_ids[shift : shift + batch * stream_len].reshape(batch, stream_len).copy()
        )
        h: torch.Tensor | None = None
        for w in range(windows_per_epoch):
            elapsed = time.perf_counter() - t0
            progress = step / args.steps if fixed_steps else elapsed / budget
            if progress >= 1.0:
                done = True
                break
            lr = lr_at(progress, step, args.lr, args.warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x = data[:, w * seq_len : (w + 1) * seq_len]
            y = data[:, w * seq_len + 1 : (w + 1) * seq_len + 1]
            logits, h = model(x, h)
            h = h.detach()
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab.size), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            step += 1
            value = loss.item()
            smooth = value if math.isnan(smooth) else 0.95 * smooth + 0.05 * value
            if not fixed_steps and step >= 5:
                # Estimated total steps of the time budget, from the average step time so far.
                bar.total = max(step, round(step * budget / (time.perf_counter() - t0)))
            bar.set_postfix(loss=f"{smooth:.3f}", lr=f"{lr:.1e}", epoch=epoch, refresh=False)
            bar.update(1)
            if (fixed_steps and step % eval_every == 0) or (not fixed_steps and progress >= next_eval_at):
                next_eval_at += 0.1
                bar.write(f"step {step}: train {smooth:.4f}, quick val {evaluate(model, quick_val):.4f}")
        epoch += 1
    bar.close()
    train_seconds = time.perf_counter() - t0
    print(f"trained {step} steps ({epoch} epochs started) in {train_seconds / 60:.1f} min")

    model.eval()
    val_fp32 = evaluate(model, val_ids)
    store_dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    tensors = {k: v.detach().to(store_dtype).contiguous() for k, v in model.state_dict().items()}
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / WEIGHTS_FILE), metadata={"format": "pt"})

    model_meta: dict[str, Any] = {
        "chars": vocab.chars,
        "fallback": vocab.fallback,
        "embedding_size": config.embedding_size,
        "hidden_size": config.hidden_size,
        "num_layers": config.num_layers,
        "weights_dtype": args.dtype,
    }
    (args.out / VOCAB_FILE).write_text(
        json.dumps(model_meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    # Measure what is actually stored (e.g. float16 weights read back into a float32 network).
    reloaded, _ = load_textlm(args.out, "cpu")
    val_loss = evaluate(reloaded, val_ids)
    train_loss = evaluate(reloaded, train_ids[-len(val_ids) :])  # same size as val: the end of train
    uni = unigram_loss(train_ids, val_ids, vocab.size)
    model_meta["training"] = {
        "text": args.text.name,
        "seed": args.seed,
        "steps": step,
        "minutes": round(train_seconds / 60, 2),
        "batch": batch,
        "seq_len": seq_len,
        "lr": args.lr,
        "threads": args.threads,
        "params": n_params,
        "train_loss": round(train_loss, 4),
        "val_loss": round(val_loss, 4),
        "val_loss_fp32": round(val_fp32, 4),
        "unigram_val_loss": round(uni, 4),
    }
    (args.out / VOCAB_FILE).write_text(
        json.dumps(model_meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    size = (args.out / WEIGHTS_FILE).stat().st_size
    print(f"wrote {args.out / WEIGHTS_FILE} ({size / 1e6:.2f} MB, {args.dtype}) and {args.out / VOCAB_FILE}")
    print(f"train loss (last {len(val_ids):,} train chars): {train_loss:.4f} nats/char")
    print(f"val loss GRU:     {val_loss:.4f} nats/char ({args.dtype} weights; {val_fp32:.4f} in fp32)")
    print(f"val loss unigram: {uni:.4f} nats/char")
    core = TextLMCore(reloaded, vocab, "cpu")
    sample = generate(core, "ROMEO:\n", 300, temperature=0.8, seed=args.seed)
    print("sample (temperature 0.8, prompt 'ROMEO:\\n'):")
    print("ROMEO:\n" + sample)


if __name__ == "__main__":
    main()
