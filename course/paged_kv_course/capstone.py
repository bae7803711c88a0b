"""The capstone: the tiny model served by the engine with a learner's allocator and a learner's decode kernel.

The engine stays the library's (scheduler, chunked prefill, prefix caching, preemption, streaming); two parts
can be swapped for a learner's: the block bookkeeping (a class meeting the contract of exercises 02-06, put
behind the engine by :func:`~paged_kv_course.conformance.engine_for`) and decode attention (the two
``@triton.jit`` kernels of task 09.4, launched by :func:`~paged_kv_course.triton_skeleton.paged_decode`).
Prompt chunks keep the library's torch extend attention: task 09.4 wrote a decode kernel only.

:func:`serve` runs one fixed workload with any mix of parts and returns what a learner and a grader look at:
every generated token, and the figures (tokens per second, peak blocks, prefix-cache hits, preemptions).
:func:`diagnose` swaps the parts in one at a time, so a wrong token is blamed on the part that made it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.nn import functional as F

from paged_kv_lib.engine import Engine
from paged_kv_lib.model import TinyTransformer, encode, generate_no_cache, load_tiny_model

from .conformance import engine_for
from .triton_skeleton import paged_decode

__all__ = ["Parts", "Run", "WORKLOAD", "attempt", "diagnose", "first_difference", "reference_tokens", "serve"]

# A shared system prompt (prefix-cache hits for the requests after the first), one prompt long enough to be
# chunked many times under the budget, and a pool small enough that the batch runs out of blocks once.
SYSTEM = "You are a careful assistant. Answer in one short line. "
WORKLOAD: Tuple[str, ...] = (
    SYSTEM + "What is a block table?",
    SYSTEM + "Why do engines page the KV cache?",
    "Paged attention reads keys and values through a table of blocks, one block at a time, so memory is "
    "never reserved for tokens that do not exist yet.",
    SYSTEM + "What does the free queue hold?",
)
# One more request draws two samples from one prompt: they share its blocks (fork), and each writes its own
# tokens after it (copy-on-write of the shared last block).
FORKED = ("Two parts of an engine:", 2, 0.8, 7)  # prompt, samples, temperature, seed
MAX_NEW_TOKENS = 10
NUM_BLOCKS = 40
BLOCK_SIZE = 4
TOKEN_BUDGET = 24  # tokens one step computes: long prompts spread over several steps (chunked prefill)
MAX_BATCH = 3  # the fourth request waits for a slot


@dataclass
class Run:
    """One run of the workload: the tokens each request generated (in request order) and the figures."""

    label: str
    tokens: List[List[int]]
    seconds: float
    generated: int
    peak_blocks: int
    prefix_hits: int  # prompt tokens found in the prefix cache instead of computed
    preemptions: int
    kernel_calls: int = 0  # decode-attention calls served by the learner's kernel
    stopped: Optional[str] = None  # where a run that stops at its first wrong token stopped, in words

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else 0.0

    def figures(self) -> Dict[str, str]:
        """The figures that do not depend on the machine (the speed is :attr:`tokens_per_s`)."""
        return {
            "peak blocks": str(self.peak_blocks),
            "prefix-cache hits": f"{self.prefix_hits} tokens",
            "preemptions": str(self.preemptions),
        }


@dataclass
class Parts:
    """Which parts are the learner's: an allocator class (None: the library's) and the 09.4 kernels."""

    allocator_class: Optional[type] = None
    kernel: Any = None
    merge: Any = None
    num_splits: int = 2
    calls: List[int] = field(default_factory=list)
    # How the kernels are launched: 09.4's launcher itself, or (under a grader) a function that asks for the
    # same launch where the learner's kernels live; either way (q, k_cache, v_cache, ...) -> output.
    launch: Callable[..., torch.Tensor] = paged_decode
    # The learner's own glue (task 10.3): make_decode_attention(kernel, merge) -> the engine's decode attention.
    # None: the course's, below.
    adapter: Optional[Callable[[Any, Any], Callable[..., torch.Tensor]]] = None

    @property
    def label(self) -> str:
        books = "your allocator" if self.allocator_class is not None else "library allocator"
        attention = "library attention" if self.kernel is None else "your kernel"
        attention += " through your glue" if self.adapter is not None else ""
        return f"{books} + {attention}"

    def decode_attention(self) -> Optional[Callable[..., torch.Tensor]]:
        """The decode attention the engine calls on decode-only steps, through the 09.4 launcher."""
        if self.kernel is None:
            return None
        if self.adapter is not None:
            theirs = self.adapter(self.kernel, self.merge)

            def counted(*args: torch.Tensor) -> torch.Tensor:
                self.calls.append(args[0].shape[0])
                return theirs(*args)

            return counted

        def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                   seq_lens: torch.Tensor) -> torch.Tensor:
            self.calls.append(q.shape[0])
            head_dim = q.shape[-1]
            # 09.4's kernels take a power-of-two HEAD_DIM (tl.arange); the tiny model's heads are 24 wide. Zeros
            # appended to q and K change no score, zeros appended to V only add output columns, cut off below.
            width = max(16, 1 << (head_dim - 1).bit_length())
            q, k_cache, v_cache = (F.pad(t, (0, width - head_dim)) for t in (q, k_cache, v_cache))
            out = self.launch(self.kernel, self.merge, q, k_cache, v_cache, block_tables, seq_lens,
                              1.0 / math.sqrt(head_dim), self.num_splits)
            return out[..., :head_dim]

        return attend


@lru_cache(maxsize=1)
def _model() -> TinyTransformer:
    return load_tiny_model()


@lru_cache(maxsize=1)
def reference_tokens() -> Tuple[Tuple[int, ...], ...]:
    """What every run must generate, token for token, computed without any cache: each streamed request's
    greedy tokens, then each sample of the forked request."""
    model = _model()
    prompt, samples, temperature, seed = FORKED
    greedy = [tuple(generate_no_cache(model, encode(p), MAX_NEW_TOKENS)) for p in WORKLOAD]
    sampled = [tuple(generate_no_cache(model, encode(prompt), MAX_NEW_TOKENS, temperature=temperature, seed=seed,
                                       sample_index=i)) for i in range(samples)]
    return tuple(greedy + sampled)


def _engine(parts: Parts) -> Engine:
    model = _model()
    options: Dict[str, Any] = dict(max_batch_size=MAX_BATCH, max_num_batched_tokens=TOKEN_BUDGET, watermark=0.0,
                                   decode_attention=parts.decode_attention())
    if parts.allocator_class is None:
        allocator = model.new_allocator(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        return Engine(model, allocator, **options)
    return engine_for(model, parts.allocator_class, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                      enable_prefix_caching=True, **options)


def serve(parts: Optional[Parts] = None, stop_at_wrong: bool = False) -> Run:
    """Stream the workload through an engine made of ``parts``; every token and the figures. With
    ``stop_at_wrong``, the run stops at the first streamed token that differs from the no-cache reference
    (:attr:`Run.stopped` says where): a broken part is named in seconds, not after the whole workload."""
    parts = parts or Parts()
    engine = _engine(parts)
    prompt, samples, temperature, seed = FORKED
    start = time.perf_counter()
    forked = engine.add_request(prompt, MAX_NEW_TOKENS, n=samples, temperature=temperature, seed=seed)
    tokens: Dict[int, List[int]] = {}
    want = reference_tokens() if stop_at_wrong else ()
    stopped = None
    events = engine.stream(list(WORKLOAD), MAX_NEW_TOKENS)  # the forked request runs along
    for event in events:
        got = tokens.setdefault(event.request_id, [])
        got.append(event.token_id)
        index = event.request_id - forked - 1  # the streamed requests' ids follow the forked one's, in order
        if 0 <= index < len(want) and got != list(want[index][:len(got)]):
            stopped = _where(index, got, want[index])
            events.close()  # aborts the requests still running
            break
    outputs = [] if stopped else [o for o in engine.run(progress=False) if o.request_id == forked][0].outputs
    seconds = time.perf_counter() - start
    ordered = [tokens.get(i, []) for i in sorted(tokens)] + [list(o) for o in outputs]
    totals = engine.totals
    return Run(parts.label, ordered, seconds, totals.generated_tokens, totals.peak_blocks_used, totals.cached_tokens,
               totals.preemptions, kernel_calls=len(parts.calls), stopped=stopped)


def _where(index: int, got: Sequence[int], want: Sequence[int]) -> str:
    """The first token of the ``index``-th token list (streamed requests, then samples) that differs, in words."""
    who = f"request {index}" if index < len(WORKLOAD) else f"sample {index - len(WORKLOAD)} of the forked request"
    at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    return (f"{who}, token {at}: got {list(got)[at:at + 3]}, the no-cache reference has {list(want)[at:at + 3]} "
            f"({len(got)} of {len(want)} tokens generated)")


def first_difference(run: Run) -> Optional[str]:
    """Where ``run``'s tokens first differ from the no-cache reference, in words; None when they all agree."""
    if run.stopped:
        return run.stopped
    want_all = reference_tokens()
    if len(run.tokens) != len(want_all):
        return f"{len(run.tokens)} token lists, the workload has {len(want_all)} (streamed requests and samples)"
    for index, (got, want) in enumerate(zip(run.tokens, want_all)):
        if list(got) != list(want):
            return _where(index, got, want)
    return None


def attempt(parts: Parts) -> Tuple[Optional[Run], Optional[str]]:
    """Serve the workload with ``parts``: the run and its first wrong token (None: token for token), or no run
    and what it raised; the run stops at its first wrong token. ``NotImplementedError`` (a task not written
    yet) is raised, not reported."""
    try:
        run = serve(parts, stop_at_wrong=True)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - a part failed: what it raised is the report
        text = str(exc).strip()
        return None, f"it raised {type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
    return run, first_difference(run)


def diagnose(allocator_class: Optional[type], kernel: Any = None, merge: Any = None) -> List[Tuple[str, Optional[str]]]:
    """The library's engine with the learner's parts swapped in one at a time, then both: each run's label and
    its first wrong token or error (None: token for token). A part that breaks alone is the part to fix.
    A part left as None is the library's: its run alone, and the run with both, are left out."""
    runs = []
    if allocator_class is not None:
        runs.append(Parts(allocator_class=allocator_class))
    if kernel is not None:
        runs.append(Parts(kernel=kernel, merge=merge))
    if allocator_class is not None and kernel is not None:
        runs.append(Parts(allocator_class=allocator_class, kernel=kernel, merge=merge))
    return [(parts.label, attempt(parts)[1]) for parts in runs]


def figures_table(runs: Sequence[Run]) -> str:
    """The runs' figures side by side, one column a run."""
    rows = ["", *runs[0].figures()]
    width = max(len(r) for r in rows)
    cols = [max(len(run.label), 10) for run in runs]
    lines = [" " * width + "  " + "  ".join(run.label.rjust(c) for run, c in zip(runs, cols))]
    for name in rows[1:]:
        lines.append(name.ljust(width) + "  " + "  ".join(run.figures()[name].rjust(c) for run, c in zip(runs, cols)))
    speeds = ", ".join(f"{run.label}: {run.tokens_per_s:.1f} tokens/s" for run in runs)
    return "\n".join(lines + [f"speed ({speeds})"])
