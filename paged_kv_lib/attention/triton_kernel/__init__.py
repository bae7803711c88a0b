"""Paged attention as Triton kernels: decode (with a split-K path) and prefill/extend.

One program owns one sequence and one K/V head, and with it every query head of that
head's group (grouped-query attention), so each K/V tile is read from memory once. It
walks the sequence's tokens ``BLOCK_N`` at a time, turning each logical position into a
physical cache row through the block table, and keeps a running softmax (the "online
softmax" of FlashAttention) so scores are never written out.

Long contexts with few sequences leave most of a GPU idle, so the decode kernel can also
cut each sequence into ``num_splits`` chunks handled by separate programs ("split-K",
or flash-decoding); a second small kernel merges their partial results.

The kernels live one per module (``decode.py``, ``merge.py``, ``extend.py``, and the two
helpers they inline in ``tiles.py``); this module holds the sizes and limits, the launch
planning and the launchers. Importing it imports Triton. On a machine without a GPU, set
``TRITON_INTERPRET=1`` before Triton is first imported to run the kernels on the CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from ...block import cdiv
from ...errors import InvalidArgumentError
from .decode import _paged_decode_kernel
from .extend import _paged_extend_kernel
from .merge import _merge_splits_kernel
from .tiles import _kv_tile_offsets, _online_softmax_step  # noqa: F401  (re-exported: lessons and tests read them here)

# exp(x) == exp2(x * log2(e)); exp2 is the cheaper instruction on GPUs.
LOG2_E = 1.4426950408889634

# Split-K heuristic: aim for this many programs per streaming multiprocessor, and never
# give a split fewer than MIN_TOKENS_PER_SPLIT tokens (its partial write would dominate).
PROGRAMS_PER_SM = 2
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
# What a caller may ask for (``check_num_splits``); the merge caps it by head_dim below.
MAX_REQUESTED_SPLITS = 256
# The merge kernel's [num_splits, head_dim] fp32 tile stays in registers up to this many
# elements with 4 warps on sm_90 (128 x 128: 153 registers); 256 x 256 spilled 4.9 KB a
# thread (benchmarks/kernel_resources.py).
MERGE_TILE_ELEMENTS = 16384

# Query rows (query tokens x query heads of a group) per extend tile, by operand dtype.
EXTEND_ROWS = 64
EXTEND_ROWS_FP32 = 32

# CUDA limits a grid's second and third dimensions to 65,535 programs.
MAX_GRID_YZ = 65535

# Fused multiply-add in the compiled kernels (Triton 3.9's default, passed explicitly).
FP_FUSION = True


# ----------------------------------------------------------------------------- launchers
def is_interpreting() -> bool:
    """Whether Triton runs kernels on the CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return isinstance(_paged_decode_kernel, InterpretedFunction)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """How many chunks to cut each sequence into, a power of two.

    Split only when the ``num_seqs * num_kv_heads`` programs would leave the
    ``num_sms`` multiprocessors short of ``PROGRAMS_PER_SM`` programs each, and only
    as far as every split keeps ``MIN_TOKENS_PER_SPLIT`` tokens of ``max_context``.
    """
    programs = max(1, num_seqs * num_kv_heads)
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    by_occupancy = _next_power_of_2(cdiv(target, programs))
    by_length = 1 << max(0, (max_context // MIN_TOKENS_PER_SPLIT).bit_length() - 1)
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def max_merge_splits(head_dim: int) -> int:
    """The most splits the merge kernel takes at ``head_dim`` without spilling registers.

    It holds a ``[num_splits, head_dim]`` fp32 tile across 128 threads; past
    ``MERGE_TILE_ELEMENTS`` elements (compiled for sm_90) that tile spills to local
    memory, so larger requests are cut to this many splits.
    """
    return max(1, min(MAX_REQUESTED_SPLITS, MERGE_TILE_ELEMENTS // _next_power_of_2(head_dim)))


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not is_interpreting():
        raise RuntimeError(
            "the triton backend got CPU tensors but Triton is not in interpreter mode; "
            "set TRITON_INTERPRET=1 before triton is first imported, or use backend='torch'"
        )


def _dot_settings(dtype: torch.dtype) -> tuple:
    """``(DOT_IN_FP32, INPUT_PRECISION)`` for a dtype.

    fp32 asks for exact ("ieee") products rather than TF32. The CPU interpreter
    multiplies bf16 operands as raw bits, so there bf16 is upcast before each dot.
    """
    dot_in_fp32 = dtype == torch.bfloat16 and is_interpreting()
    precision = "ieee" if dtype == torch.float32 else "tf32"
    return dot_in_fp32, precision


def decode_config(dtype: torch.dtype, head_dim: int) -> Dict[str, int]:
    """Default ``block_n``, ``num_warps`` and ``num_stages`` of the decode kernel.

    fp32 at head_dim 256 gets 8 warps: with 4 it spilled about 6 KB a thread on sm_90.
    """
    num_warps = 8 if dtype == torch.float32 and head_dim > 128 else 4
    return dict(block_n=32 if head_dim > 128 else 64, num_warps=num_warps, num_stages=2)


def extend_config(dtype: torch.dtype, head_dim: int, group: int, max_query_len: int) -> Dict[str, int]:
    """Default tile shape and launch settings of the extend kernel.

    A tile has ``block_q * next_pow2(group)`` query rows, each with a ``head_dim`` fp32
    accumulator. fp32 operands take twice the registers of 16-bit ones, so fp32 gets half
    the rows and fewer keys per tile; from ``head_dim`` 128 up, 8 warps share the
    accumulators. These are the largest tiles that compiled for sm_90 without spilling
    (``benchmarks/kernel_resources.py``); the old fp32 tiles took 255 registers and up to
    9 KB of stack a thread at head_dim 128.
    """
    block_g = _next_power_of_2(group)
    rows = EXTEND_ROWS_FP32 if dtype == torch.float32 else EXTEND_ROWS
    # Fewer query tokens when the group is wide, never fewer than tl.dot's 16 rows, and
    # no more tokens than the longest query needs.
    block_q = max(1, rows // block_g)
    block_q = min(block_q, max(_next_power_of_2(max(1, max_query_len)), cdiv(16, block_g)))
    if dtype == torch.float32:
        block_n = 16 if 64 < head_dim <= 128 else 32
    else:
        block_n = 32 if head_dim > 128 else 64
    return dict(block_q=block_q, block_n=block_n, num_warps=8 if head_dim >= 128 else 4, num_stages=2)


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel call, fully decided: kernel, grid, arguments and launch options.

    The launchers run these; a compile-only check (``kernel.warmup``) can build the very
    same calls from placeholder tensors and compile them for a GPU that is not there.
    """

    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    options: Dict[str, Any]

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.options)


def _launch_options(constexprs: Dict[str, Any], num_warps: int, num_stages: int) -> Dict[str, Any]:
    # enable_fp_fusion is passed explicitly: Triton 3.9 warns on stderr when a launch leaves
    # it unset (its default flips in 3.10), and fused multiply-adds are what we measured.
    return dict(constexprs, num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=FP_FUSION)


def plan_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    *,
    num_splits: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
) -> List[KernelLaunch]:
    """The kernel calls of one decode step into ``out``: the attention kernel, then (with
    more than one split) the merge. Allocates the split partial buffers."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_blocks, num_kv_heads, block_size, _ = k_cache.shape
    max_blocks = block_tables.shape[1]
    config = decode_config(q.dtype, head_dim)
    block_n = block_n or config["block_n"]
    if num_splits is None:
        # The table width bounds every sequence's length without reading seq_lens (a sync).
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_blocks * block_size, _num_sms(q.device))
    num_splits = min(num_splits, max_merge_splits(head_dim))

    if num_splits == 1:
        part_acc = part_max = part_sum = out  # unused by the kernel
    else:
        part_acc = torch.empty((num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_max = torch.empty((num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)

    group = num_q_heads // num_kv_heads
    dot_in_fp32, precision = _dot_settings(q.dtype)
    launches = [
        KernelLaunch(
            _paged_decode_kernel,
            (num_seqs, num_kv_heads, num_splits),
            (
                q, k_cache, v_cache, block_tables, seq_lens,
                out, part_acc, part_max, part_sum,
                scale * LOG2_E, num_blocks, max_blocks, num_q_heads,
                *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
            ),
            _launch_options(
                dict(
                    GROUP=group,
                    HEAD_DIM=head_dim,
                    BLOCK_SIZE=block_size,
                    BLOCK_G=max(16, _next_power_of_2(group)),
                    BLOCK_D=_next_power_of_2(head_dim),
                    BLOCK_N=block_n,
                    NUM_SPLITS=num_splits,
                    DOT_IN_FP32=dot_in_fp32,
                    INPUT_PRECISION=precision,
                ),
                num_warps or config["num_warps"],
                num_stages or config["num_stages"],
            ),
        )
    ]
    if num_splits > 1:
        launches.append(
            KernelLaunch(
                _merge_splits_kernel,
                (num_seqs, num_q_heads),
                (out, part_acc, part_max, part_sum, num_q_heads, *out.stride()),
                _launch_options(
                    dict(HEAD_DIM=head_dim, BLOCK_D=_next_power_of_2(head_dim), NUM_SPLITS=num_splits),
                    num_warps=4,
                    num_stages=1,
                ),
            )
        )
    return launches


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
) -> torch.Tensor:
    """Launch decode attention; inputs are assumed valid (``paged_attention`` checks them).

    ``num_splits=None`` lets ``choose_num_splits`` decide, bounding the context by the
    block table's width so no device sync is needed; any count is cut to
    ``max_merge_splits(head_dim)``. ``block_n``, ``num_warps`` and ``num_stages`` override
    ``decode_config``. Unchecked inputs stay memory-safe: a length past its table row is
    cut to the row, and an out-of-range block id drops its tokens.
    """
    _check_device(q)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0:
        return out
    for launch in plan_decode(
        q, k_cache, v_cache, block_tables, seq_lens, scale, out,
        num_splits=num_splits, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
    ):
        launch.run()
    return out


def plan_extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    *,
    max_query_len: int,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
) -> KernelLaunch:
    """The extend kernel call into ``out``; ``max_query_len`` only sizes the grid and tiles."""
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_blocks, num_kv_heads, block_size, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    group = num_q_heads // num_kv_heads
    config = extend_config(q.dtype, head_dim, group, max_query_len)
    block_q = config["block_q"]
    dot_in_fp32, precision = _dot_settings(q.dtype)
    programs_per_seq = min(max(1, triton.cdiv(max_query_len, block_q)), MAX_GRID_YZ)
    return KernelLaunch(
        _paged_extend_kernel,
        (num_seqs, programs_per_seq, num_kv_heads),
        (
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
            out,
            scale * LOG2_E, num_blocks, block_tables.shape[1],
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        ),
        _launch_options(
            dict(
                GROUP=group,
                HEAD_DIM=head_dim,
                BLOCK_SIZE=block_size,
                BLOCK_G=_next_power_of_2(group),
                BLOCK_Q=block_q,
                BLOCK_D=_next_power_of_2(head_dim),
                BLOCK_N=block_n or config["block_n"],
                DOT_IN_FP32=dot_in_fp32,
                INPUT_PRECISION=precision,
            ),
            num_warps or config["num_warps"],
            num_stages or config["num_stages"],
        ),
    )


def paged_attention_extend_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
) -> torch.Tensor:
    """Launch extend attention; inputs are assumed valid (``paged_attention_extend`` checks).

    ``max_query_len`` sizes the grid; when ``None`` it is read from ``query_start_loc``
    (a device sync on GPU). A hint below the true longest query costs speed, never
    correctness: each program loops over its sequence's query tiles by their real count.
    """
    _check_device(q)
    if max_query_len is not None and max_query_len < 0:
        raise InvalidArgumentError(f"max_query_len must be >= 0, got {max_query_len}")
    num_kv_heads = k_cache.shape[1]
    num_seqs = seq_lens.shape[0]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0] == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if num_kv_heads > MAX_GRID_YZ:
        raise InvalidArgumentError(f"num_kv_heads = {num_kv_heads} exceeds the grid limit of {MAX_GRID_YZ}")
    plan_extend(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out,
        max_query_len=max_query_len, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
    ).run()
    return out


__all__ = [
    "LOG2_E",
    "KernelLaunch",
    "choose_num_splits",
    "decode_config",
    "extend_config",
    "is_interpreting",
    "max_merge_splits",
    "paged_attention_extend_triton",
    "paged_attention_triton",
    "plan_decode",
    "plan_extend",
]
