"""Engine against a peer: the paged-kv engine beside Hugging Face ``generate`` on the same model.

The shipped tiny model is mapped one to one onto transformers' ``LlamaForCausalLM``
(``paged_kv_lib.peer``), so both run the same weights in fp32 on one torch thread. Three
workloads, greedy decoding, every request wanting a fixed number of new tokens:

* mixed: 32 prompts of 9-201 tokens (lengths spread evenly, text from the model's corpus),
  64 new tokens each;
* shared prefix: the same 32 prompts behind one shared 128-token prefix (prefix caching on);
* batch 1: one 101-token prompt, 128 new tokens.

HF runs each batch as one left-padded ``generate`` call with an attention mask and its
default cache; the engine gets every request at once (``max_batch_size`` 64, a pool that
holds the whole batch). Rounds are interleaved (engine then HF, per workload), and each
round gives one paired ratio, so both sides of a pair see the same machine load; the
median of the pairs is reported, with the wall-clock tokens per second of the median
round. K/V bytes: the engine's peak blocks in use times the bytes of a block (all
layers, K and V); HF's cache after generation (every layer's K and V tensors). The run
fails unless every engine token equals HF's.

    python benchmarks/engine.py [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from paged_kv_lib.engine import Engine
from paged_kv_lib.model import encode, load_tiny_model
from paged_kv_lib.peer import to_hf_llama

Workload = Tuple[str, List[List[int]], int, bool]  # name, prompts, new tokens, prefix caching
BLOCK_SIZE = 16


def corpus_tokens() -> List[int]:
    path = Path(__file__).resolve().parents[1] / "paged_kv_lib" / "data" / "tiny_corpus.txt"
    return encode(path.read_text(), bos=False)


def workloads() -> List[Workload]:
    """The three workloads of issue 19, built deterministically from the corpus."""
    text = corpus_tokens()
    lengths = [9 + round(i * (201 - 9) / 31) for i in range(32)]  # 9 ... 201, evenly spread
    # Each prompt is BOS + a different stretch of the corpus (so no two share a prefix).
    mixed = [[256] + text[1000 + 97 * i : 1000 + 97 * i + n - 1] for i, n in enumerate(lengths)]
    prefix = [256] + text[:127]  # 128 tokens, shared by every prompt below
    shared = [prefix + p[1:] for p in mixed]
    single = [[256] + text[5000:5100]]
    return [
        ("mixed, 32 prompts of 9-201 tokens, 64 new each", mixed, 64, False),
        ("shared 128-token prefix + the same 32, 64 new each", shared, 64, True),
        ("batch 1, 101-token prompt, 128 new", single, 128, False),
    ]


def run_engine(model, prompts: List[List[int]], new_tokens: int, prefix_caching: bool) -> Dict:
    cfg = model.config
    need = sum(-(-(len(p) + new_tokens) // BLOCK_SIZE) for p in prompts)  # the whole batch, unshared
    alloc = model.new_allocator(need + 8, BLOCK_SIZE, enable_prefix_caching=prefix_caching)
    engine = Engine(model, alloc, max_batch_size=64)
    start, cpu = time.perf_counter(), time.thread_time()
    outputs = engine.generate(prompts, new_tokens)
    seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu
    block_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * BLOCK_SIZE * cfg.head_dim * model.dtype.itemsize
    return {
        "tokens": [list(o.token_ids) for o in outputs],
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "kv_bytes": engine.totals.peak_blocks_used * block_bytes,
    }


@torch.no_grad()
def run_hf(peer, prompts: List[List[int]], new_tokens: int) -> Dict:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)  # pad id 0, on the left
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    start, cpu = time.perf_counter(), time.thread_time()
    out = peer.generate(
        ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, return_dict_in_generate=True,
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    if hasattr(cache, "layers"):  # transformers 5
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    else:  # transformers 4: per-layer lists
        tensors = list(cache.key_cache) + list(cache.value_cache)
    kv_bytes = sum(t.numel() * t.element_size() for t in tensors)
    return {
        "tokens": out.sequences[:, width:].tolist(),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "kv_bytes": kv_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per workload")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    parser.add_argument("--only", type=int, nargs="*", help="run only these workloads (0, 1, 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_tiny_model()
    peer = to_hf_llama(model)
    import transformers

    cfg = model.config
    print(
        f"tiny model dim {cfg.dim} x {cfg.num_layers} layers, {cfg.num_heads} query / {cfg.num_kv_heads} "
        f"K/V heads, fp32; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.threads} thread(s), {args.rounds} interleaved rounds, block size {BLOCK_SIZE}"
    )
    header = (
        f"{'workload':<52} {'engine tok/s':>12} {'HF tok/s':>9} {'speed ratio':>11} {'(range)':>13} "
        f"{'CPU-time ratio':>14} {'engine KV':>10} {'HF KV':>10} {'KV ratio':>8}"
    )
    print(header)
    failed = False
    for index, (name, prompts, new_tokens, prefix_caching) in enumerate(workloads()):
        if args.only and index not in args.only:
            continue
        run_engine(model, prompts[:2], 4, prefix_caching)  # warm up both
        run_hf(peer, prompts[:2], 4)
        pairs = []
        for _ in range(args.rounds):
            ours = run_engine(model, prompts, new_tokens, prefix_caching)
            theirs = run_hf(peer, prompts, new_tokens)
            if ours["tokens"] != theirs["tokens"]:
                failed = True
                print(f"  {name}: engine and HF tokens differ")
            pairs.append((theirs["seconds"] / ours["seconds"], theirs["cpu_seconds"] / ours["cpu_seconds"], ours, theirs))
        pairs.sort(key=lambda p: p[0])
        ratio, _, ours, theirs = pairs[len(pairs) // 2]
        cpu_ratio = statistics.median(p[1] for p in pairs)
        total = len(prompts) * new_tokens
        spread = f"{pairs[0][0]:.2f}-{pairs[-1][0]:.2f}"
        print(
            f"{name:<52} {total / ours['seconds']:>12.0f} {total / theirs['seconds']:>9.0f} {ratio:>10.2f}x "
            f"{spread:>13} {cpu_ratio:>13.2f}x {ours['kv_bytes'] / 2**20:>8.2f}Mi {theirs['kv_bytes'] / 2**20:>8.2f}Mi "
            f"{ours['kv_bytes'] / theirs['kv_bytes']:>7.2f}x"
        )
    print("identical greedy tokens, engine vs HF, every round: " + ("NO" if failed else "yes"))
    if failed:
        raise SystemExit("the engine and HF generate disagree")


if __name__ == "__main__":
    main()
