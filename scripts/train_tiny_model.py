"""Train the tiny byte-level model shipped in paged_kv_lib/data on the project's own corpus.

The corpus (paged_kv_lib/data/tiny_corpus.txt) is prose written for this project about
paged KV caches, so the model and its text may be redistributed with the library. A
couple of minutes on two CPU cores is enough for the model to echo readable sentences
(it mostly recites its corpus: loss about 0.1), which is all the engine demos need.
The shipped checkpoint came from the first command (about 2.5 CPU-minutes). Usage:

    python scripts/train_tiny_model.py --threads 1   # writes paged_kv_lib/data/tiny_model.pt
    python scripts/train_tiny_model.py --steps 50 --out /tmp/m.pt   # a quick smoke run
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from paged_kv_lib.model import ModelConfig, TinyTransformer, decode, encode, generate_contiguous, save_checkpoint

DATA = Path(__file__).resolve().parents[1] / "paged_kv_lib" / "data"
SHIPPED_CONFIG = ModelConfig(dim=96, num_layers=4, num_heads=4, num_kv_heads=2, hidden_dim=256)


def batches(data: torch.Tensor, batch_size: int, context: int, gen: torch.Generator):
    """Endless random windows of ``context + 1`` tokens: inputs and next-token targets."""
    while True:
        starts = torch.randint(0, data.numel() - context - 1, (batch_size,), generator=gen)
        window = torch.stack([data[s : s + context + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


def train(steps: int, batch_size: int, context: int, lr: float, seed: int) -> TinyTransformer:
    torch.manual_seed(seed)
    text = (DATA / "tiny_corpus.txt").read_text(encoding="utf-8")
    # Every paragraph starts with BOS, as prompts do.
    ids = [t for para in text.split("\n\n") if para.strip() for t in encode(para.strip() + "\n\n")]
    data = torch.tensor(ids, dtype=torch.int64)
    model = TinyTransformer(SHIPPED_CONFIG, seed=seed)
    # The engine-friendly init is too loud for training; start from small weights.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(0.5 if name == "embed.weight" else 0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    warmup = max(1, steps // 20)
    bar = tqdm(range(steps), desc="train", unit="step")
    stream = batches(data, batch_size, context, gen)
    for step in bar:
        scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr * max(scale, 0.05)
        x, y = next(stream)
        loss = F.cross_entropy(model(x).reshape(-1, model.config.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is faster on a busy machine)")
    parser.add_argument("--out", type=Path, default=DATA / "tiny_model.pt")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = train(args.steps, args.batch_size, args.context, args.lr, args.seed)
    save_checkpoint(model, str(args.out))
    print(f"trained in {time.perf_counter() - start:.0f} s; wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    for prompt in ("The allocator", "A block table"):
        print(repr(prompt + decode(generate_contiguous(model, encode(prompt), 80))))


if __name__ == "__main__":
    main()
