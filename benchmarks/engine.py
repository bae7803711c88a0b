"""Engine against two peers: the paged-kv engine beside Hugging Face ``generate`` and HF's continuous batching.

The shipped tiny model is mapped one to one onto transformers' ``LlamaForCausalLM``
(``paged_kv_lib.model.hf_peer``), so all three run the same weights in fp32 on one torch thread.
Four workloads, greedy decoding, every request wanting a fixed number of new tokens:

* mixed: 32 prompts of 9-201 tokens (lengths spread evenly, text from the model's corpus),
  64 new tokens each;
* shared prefix: the same 32 prompts behind one shared 128-token prefix (prefix caching on);
* batch 1: one 101-token prompt, 128 new tokens;
* 128 at once: 128 prompts of 9-201 tokens (four of each length, different text), 32 new each.

Peers. ``generate``: each batch as one left-padded call with an attention mask and its
default cache. Continuous batching (``generate_batch``, transformers 5): its paged cache
with the sizes that make it run on a CPU, stated because its defaults are sized for a GPU
(here they build a dense mask of many GiB): ``page_size`` 16 (our block size),
``num_blocks`` the engine's pool, ``max_batch_tokens`` 256, no CUDA graphs; its block
sharing (prefix caching) is on for the shared-prefix workload only, as the engine's.

The engine gets every request at once (``max_batch_size`` 128, a pool that holds the whole
batch; ``--budget`` sets ``max_num_batched_tokens``, default none). Rounds are interleaved
(engine, then each peer, per workload); each round gives one paired CPU-time ratio per
peer (process CPU time: the continuous batching manager works in a thread of its own),
so every side of a round sees the same machine load; the median and range of the rounds
are reported. K/V bytes: the engine's peak blocks in use times the bytes of a block (all
layers, K and V); ``generate``'s cache after generation; continuous batching's pool
(``num_blocks`` pages per layer, K and V). The run fails unless every token of every
side is the same.

    python benchmarks/engine.py [--rounds 5] [--threads 1] [--only 0 3] [--budget 512] [--no-cb]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from paged_kv_lib.engine import Engine
from paged_kv_lib.model import encode, load_tiny_model
from paged_kv_lib.model.hf_peer import to_hf_llama

Workload = Tuple[str, List[List[int]], int, bool]  # name, prompts, new tokens, prefix caching
BLOCK_SIZE = 16


def corpus_tokens() -> List[int]:
    path = Path(__file__).resolve().parents[1] / "paged_kv_lib" / "data" / "tiny_corpus.txt"
    return encode(path.read_text(), bos=False)


def workloads() -> List[Workload]:
    """The four workloads of issues 19 and 25, built deterministically from the corpus."""
    text = corpus_tokens()
    lengths = [9 + round(i * (201 - 9) / 31) for i in range(32)]  # 9 ... 201, evenly spread
    # Each prompt is BOS + a different stretch of the corpus (so no two share a prefix).
    mixed = [[256] + text[1000 + 97 * i : 1000 + 97 * i + n - 1] for i, n in enumerate(lengths)]
    prefix = [256] + text[:127]  # 128 tokens, shared by every prompt below
    shared = [prefix + p[1:] for p in mixed]
    single = [[256] + text[5000:5100]]
    many = [[256] + text[200 + 53 * i : 200 + 53 * i + lengths[i % 32] - 1] for i in range(128)]  # in the corpus
    return [
        ("mixed, 32 prompts of 9-201 tokens, 64 new each", mixed, 64, False),
        ("shared 128-token prefix + the same 32, 64 new each", shared, 64, True),
        ("batch 1, 101-token prompt, 128 new", single, 128, False),
        ("128 at once, prompts of 9-201 tokens, 32 new each", many, 32, False),
    ]


def pool_blocks(prompts: List[List[int]], new_tokens: int) -> int:
    """A pool that holds the whole batch unshared, with a little room to spare (the engine's and CB's)."""
    return sum(-(-(len(p) + new_tokens) // BLOCK_SIZE) for p in prompts) + 8


def run_engine(model, prompts: List[List[int]], new_tokens: int, prefix_caching: bool,
               budget: Optional[int] = None) -> Dict:
    cfg = model.config
    alloc = model.new_allocator(pool_blocks(prompts, new_tokens), BLOCK_SIZE, enable_prefix_caching=prefix_caching)
    engine = Engine(model, alloc, max_batch_size=128, max_num_batched_tokens=budget)
    start, cpu = time.perf_counter(), time.process_time()
    outputs = engine.generate(prompts, new_tokens)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
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
    start, cpu = time.perf_counter(), time.process_time()
    out = peer.generate(
        ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, return_dict_in_generate=True,
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
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


CB_MAX_BATCH_TOKENS = 256


@torch.no_grad()
def run_hf_cb(peer, prompts: List[List[int]], new_tokens: int, prefix_caching: bool) -> Dict:
    """transformers' continuous batching (``generate_batch``) with CPU-sized settings (see the module docstring)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    num_blocks = pool_blocks(prompts, new_tokens)
    gen = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=BLOCK_SIZE, num_blocks=num_blocks, max_batch_tokens=CB_MAX_BATCH_TOKENS,
                                  use_cuda_graph=False, allow_block_sharing=prefix_caching)
    start, cpu = time.perf_counter(), time.process_time()
    out = peer.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb,
                              progress_bar=False, warmup=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    cfg = peer.config
    kv_bytes = 2 * cfg.num_hidden_layers * num_blocks * BLOCK_SIZE * cfg.num_key_value_heads * cfg.head_dim * 4
    return {
        "tokens": [list(out[f"req_{i}"].generated_tokens) for i in range(len(prompts))],
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "kv_bytes": kv_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per workload")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every side")
    parser.add_argument("--only", type=int, nargs="*", help="run only these workloads (0, 1, 2, 3)")
    parser.add_argument("--budget", type=int, default=None, help="the engine's max_num_batched_tokens")
    parser.add_argument("--no-cb", action="store_true", help="leave out transformers' continuous batching")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)  # "eos_token_id not set": on purpose
    model = load_tiny_model()
    peer = to_hf_llama(model)
    import transformers

    cfg = model.config
    print(
        f"tiny model dim {cfg.dim} x {cfg.num_layers} layers, {cfg.num_heads} query / {cfg.num_kv_heads} "
        f"K/V heads, fp32; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.threads} thread(s), {args.rounds} interleaved rounds, block/page size {BLOCK_SIZE}, "
        f"engine budget {args.budget or 'none'}, CB max_batch_tokens {CB_MAX_BATCH_TOKENS}"
    )
    peers = [("generate", lambda prompts, new, caching: run_hf(peer, prompts, new))]
    if not args.no_cb:
        peers.append(("CB", lambda prompts, new, caching: run_hf_cb(peer, prompts, new, caching)))
    print(f"{'workload':<52} {'engine tok/s':>12} " + " ".join(
        f"{name + ' tok/s':>14} {'CPU ratio':>9} {'(range)':>11} {'KV ratio':>8}" for name, _ in peers
    ) + f" {'engine KV':>10}")
    failed = False
    for index, (name, prompts, new_tokens, prefix_caching) in enumerate(workloads()):
        if args.only and index not in args.only:
            continue
        run_engine(model, prompts[:2], 4, prefix_caching, args.budget)  # warm up every side
        for _, fn in peers:
            fn(prompts[:2], 4, prefix_caching)
        rounds: List[Tuple[Dict, List[Dict]]] = []
        for _ in range(args.rounds):
            ours = run_engine(model, prompts, new_tokens, prefix_caching, args.budget)
            theirs = [fn(prompts, new_tokens, prefix_caching) for _, fn in peers]
            for (peer_name, _), result in zip(peers, theirs):
                if ours["tokens"] != result["tokens"]:
                    failed = True
                    print(f"  {name}: engine and {peer_name} tokens differ")
            rounds.append((ours, theirs))
        total = len(prompts) * new_tokens
        cells = []
        for k in range(len(peers)):
            ratios = sorted(r[1][k]["cpu_seconds"] / r[0]["cpu_seconds"] for r in rounds)
            seconds = statistics.median(r[1][k]["cpu_seconds"] for r in rounds)
            kv = rounds[0][0]["kv_bytes"] / rounds[0][1][k]["kv_bytes"]
            cells.append(f"{total / seconds:>14.0f} {statistics.median(ratios):>8.2f}x "
                         f"{ratios[0]:>5.2f}-{ratios[-1]:<5.2f} {kv:>7.2f}x")
        engine_seconds = statistics.median(r[0]["cpu_seconds"] for r in rounds)
        print(f"{name:<52} {total / engine_seconds:>12.0f} " + " ".join(cells)
              + f" {rounds[0][0]['kv_bytes'] / 2**20:>8.2f}Mi")
    print("tokens/s are per CPU second (medians); a ratio is peer CPU time / engine CPU time in one round "
          "(> 1: the engine is faster); KV ratio: engine K/V bytes / the peer's")
    print("identical greedy tokens, engine vs every peer, every round: " + ("NO" if failed else "yes"))
    if failed:
        raise SystemExit("the engine and a peer disagree")


if __name__ == "__main__":
    main()
