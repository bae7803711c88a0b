"""Launchers for exercise 09's Triton tasks: they run the learner's ``@triton.jit`` code, and answer nothing.

Three entry points, one per Triton task:

* :func:`tile_addresses_table` runs a learner's ``tile_addresses`` (task 09.1) over every
  position of every sequence and query head, and returns the offsets and readable flags it gave;
* :func:`fold_tiles` runs a learner's ``fold_tile`` (task 09.2) over given tiles of scores and
  values, and returns the running state after each tile;
* :func:`paged_decode` launches a learner's whole decode kernel and merge kernel (task 09.4)
  in the library's calling convention, one program per (sequence, K/V head, split).

None of them masks or repairs what the learner's code reads. Instead the memory around what
they pass is poisoned, so a missing mask shows up as NaN rather than being hidden: the caches
are views into larger buffers with NaN blocks before and after them (block id -1 lands in
one), one more NaN block is appended inside the range the kernel is told about (``trap``),
and the block table's row is padded with that trap id past its ``width`` entries. Under
``TRITON_INTERPRET=1`` the kernels run on the CPU; otherwise CPU tensors go to the GPU and
the results come back, so the same cell works on both.
"""

from __future__ import annotations

import math
import os
from typing import Any, Tuple

import torch
import triton
import triton.language as tl

from paged_kv_lib.block import cdiv

BLOCK_N = 16  # tokens per tile (a matrix product wants at least 16 rows)
GUARD_BLOCKS = 2  # NaN blocks on each side of a cache
TABLE_PAD = 4  # trap columns after each block-table row (and one trap row after the last)
# Passed explicitly, as the library's launchers do: Triton 3.9 warns on stderr when a launch leaves it unset.
FP_FUSION = True


def _device_for(t: torch.Tensor) -> torch.device:
    if os.environ.get("TRITON_INTERPRET") == "1" or t.device.type == "cuda":
        return t.device
    if not torch.cuda.is_available():
        raise RuntimeError("no GPU: set os.environ['TRITON_INTERPRET'] = '1' before triton is imported "
                           "to run the kernel on the CPU")
    return torch.device("cuda")


class NotAKernelError(TypeError):
    """What a launcher raises when it is handed something other than a ``@triton.jit`` function."""


def require_kernel(name: str, obj: Any) -> None:
    """Refuse ``obj`` unless it is exactly what ``@triton.jit`` makes (a compiled or interpreted kernel).

    The type is compared exactly: an object that only answers ``obj[grid]`` or subclasses the
    kernel class is not a kernel this course launches, whatever it computes.
    """
    from triton.runtime.jit import JITFunction

    kinds: list[type] = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        kinds.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - a Triton without the interpreter
        pass
    if type(obj) not in kinds:
        raise NotAKernelError(f"{name} is a {type(obj).__name__}, not a @triton.jit function: this task is "
                              "passed by a Triton kernel the cell defines with @triton.jit, launched here")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _padded_table(block_tables: torch.Tensor, trap: int, device: torch.device) -> torch.Tensor:
    """The table in a wider buffer: every entry past a row's width, and one whole extra row, is ``trap``."""
    rows, width = block_tables.shape
    table = torch.full((rows + 1, width + TABLE_PAD), trap, dtype=torch.int32, device=device)
    table[:rows, :width] = block_tables.to(device=device, dtype=torch.int32)
    return table


# --------------------------------------------------------------------------- task 09.1
@triton.jit
def _address_driver(table_ptr, lens_ptr, rows_out, valid_out, stride_ts, table_width, num_blocks,
                    stride_kb, stride_kh, stride_kt, num_positions,
                    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, ADDRESSES: tl.constexpr):
    """Ask ADDRESSES about every tile of positions 0 .. num_positions-1 of one (sequence, query head)."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(lens_ptr + seq)
    base = (seq * tl.num_programs(1) + head) * num_positions
    for start in range(0, num_positions, TILE):
        pos = start + tl.arange(0, TILE)
        rows, valid = ADDRESSES(table_ptr + seq * stride_ts, pos, seq_len, head, table_width, num_blocks,
                                stride_kb, stride_kh, stride_kt, GROUP, BLOCK_SIZE)
        tl.store(rows_out + base + pos, rows.to(tl.int64))
        tl.store(valid_out + base + pos, valid.to(tl.int8))


def tile_addresses_table(tile_addresses: Any, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         cache_shape: Tuple[int, int, int, int], num_q_heads: int,
                         num_positions: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Run ``tile_addresses`` for positions ``0 .. num_positions-1`` of every sequence and query head.

    ``cache_shape`` is ``(num_blocks, num_kv_heads, block_size, head_dim)`` of a contiguous cache
    (only its strides and sizes are used: nothing is loaded from a cache). Returns ``rows``
    (int64) and ``valid`` (bool), both ``[num_seqs, num_q_heads, num_positions]``. The table the
    function reads has trap entries (block id 0) past each row's width and a trap row after the last.
    """
    require_kernel("tile_addresses", tile_addresses)
    num_blocks, num_kv_heads, block_size, head_dim = cache_shape
    device = _device_for(block_tables)
    num_seqs = block_tables.shape[0]
    num_positions = cdiv(num_positions, BLOCK_N) * BLOCK_N
    table = _padded_table(block_tables, 0, device)
    lens = seq_lens.to(device=device, dtype=torch.int32).contiguous()
    rows = torch.full((num_seqs, num_q_heads, num_positions), -(2 ** 40), dtype=torch.int64, device=device)
    valid = torch.zeros((num_seqs, num_q_heads, num_positions), dtype=torch.int8, device=device)
    strides = (num_kv_heads * block_size * head_dim, block_size * head_dim, head_dim)
    if num_seqs:
        _address_driver[(num_seqs, num_q_heads)](
            table, lens, rows, valid, table.stride(0), block_tables.shape[1], num_blocks, *strides, num_positions,
            GROUP=num_q_heads // num_kv_heads, BLOCK_SIZE=block_size, TILE=BLOCK_N, ADDRESSES=tile_addresses,
            enable_fp_fusion=FP_FUSION)
    return rows.cpu(), valid.cpu().bool()


# --------------------------------------------------------------------------- task 09.2
@triton.jit
def _fold_driver(scores_ptr, values_ptr, m_out, l_out, acc_out, num_tiles,
                 TILE: tl.constexpr, D: tl.constexpr, FOLD: tl.constexpr):
    """Fold one row of tiles with FOLD from the empty state, writing the state after every tile."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, TILE)
    d = tl.arange(0, D)
    one = tl.arange(0, 1)
    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for t in range(0, num_tiles):
        tile = row * num_tiles + t
        scores = tl.load(scores_ptr + tile * TILE + n)
        v = tl.load(values_ptr + (tile * TILE + n)[:, None] * D + d[None, :])
        m_i, l_i, acc = FOLD(m_i, l_i, acc, scores, v)
        tl.store(m_out + tile + one, m_i)
        tl.store(l_out + tile + one, l_i)
        tl.store(acc_out + tile * D + d, acc)


def fold_tiles(fold_tile: Any, scores: torch.Tensor,
               values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold ``scores`` ``[rows, tiles, TILE]`` and ``values`` ``[rows, tiles, TILE, D]`` tile by tile.

    Each row starts from the empty state (``m = -inf``, ``l = 0``, ``acc = 0``). Returns the state
    after each tile: ``m`` and ``l`` ``[rows, tiles]``, ``acc`` ``[rows, tiles, D]`` (float32).
    """
    require_kernel("fold_tile", fold_tile)
    device = _device_for(scores)
    rows, tiles, tile = scores.shape
    d = values.shape[-1]
    s = scores.to(device=device, dtype=torch.float32).contiguous()
    v = values.to(device=device, dtype=torch.float32).contiguous()
    m = torch.full((rows, tiles), float("nan"), device=device)
    l_out = torch.full((rows, tiles), float("nan"), device=device)
    acc = torch.full((rows, tiles, d), float("nan"), device=device)
    if rows and tiles:
        _fold_driver[(rows,)](s, v, m, l_out, acc, tiles, TILE=tile, D=d, FOLD=fold_tile, enable_fp_fusion=FP_FUSION)
    return m.cpu(), l_out.cpu(), acc.cpu()


# --------------------------------------------------------------------------- task 09.4
def paged_decode(
    kernel: Any,
    merge: Any,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int = 1,
    *,
    partials: bool = False,
) -> Any:
    """Decode attention through the learner's ``kernel`` (and ``merge`` when ``num_splits > 1``).

    Shapes as in :func:`paged_kv_lib.attention.paged_attention`: ``q`` ``[num_seqs, num_q_heads,
    head_dim]``, caches ``[num_blocks, num_kv_heads, block_size, head_dim]`` (``head_dim`` a power
    of two, at least 16), ``block_tables`` int ``[num_seqs, width]``, ``seq_lens`` int
    ``[num_seqs]``; ``num_splits`` a power of two. ``kernel`` runs on the grid ``(num_seqs,
    num_kv_heads, num_splits)``, then ``merge`` on ``(num_seqs, num_q_heads)``. Returns the output
    (``q``'s shape and dtype, on ``q``'s device); with ``partials=True`` also the split buffers
    ``(max, sum, acc)`` as the kernel left them (NaN where it wrote nothing).
    """
    num_seqs, num_q_heads, head_dim = q.shape
    num_blocks, num_kv_heads, block_size, _ = k_cache.shape
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} must be a power of two, at least 16")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if num_splits < 1 or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits {num_splits} must be a power of two")
    require_kernel("paged_decode_kernel", kernel)
    if num_splits > 1:
        require_kernel("merge_splits_kernel", merge)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    home = q.device
    device = _device_for(q)
    trap = num_blocks  # an in-range block (the kernel is told num_blocks + 1) that holds NaN
    k_view, v_view = (_guarded(c, device) for c in (k_cache, v_cache))
    table = _padded_table(block_tables, trap, device)
    lens = seq_lens.to(device=device, dtype=torch.int32).contiguous()
    group = num_q_heads // num_kv_heads
    rows = max(16, _pow2(group))  # BLOCK_G: the query rows one program may touch, GROUP of them real
    # Each buffer is a view into a longer one: what a program reads or writes past the end lands there.
    qd, _ = _with_tail(q.shape, q.dtype, device, rows * head_dim, 0.0)
    qd.copy_(q)
    out, out_tail = _with_tail(q.shape, q.dtype, device, rows * head_dim)
    part_max, max_tail = _with_tail((num_seqs, num_q_heads, num_splits), torch.float32, device, rows * num_splits)
    part_sum, sum_tail = _with_tail((num_seqs, num_q_heads, num_splits), torch.float32, device, rows * num_splits)
    part_acc, acc_tail = _with_tail((num_seqs, num_q_heads, num_splits, head_dim), torch.float32, device,
                                    rows * num_splits * head_dim)
    if num_seqs:
        kernel[(num_seqs, num_kv_heads, num_splits)](
            qd, k_view, v_view, table, lens, out, part_acc, part_max, part_sum,
            scale, num_blocks + 1, block_tables.shape[1], num_q_heads,
            qd.stride(0), qd.stride(1), k_view.stride(0), k_view.stride(1), k_view.stride(2), table.stride(0),
            out.stride(0), out.stride(1),
            GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_G=rows,
            BLOCK_N=BLOCK_N, NUM_SPLITS=num_splits, enable_fp_fusion=FP_FUSION,
        )
        if num_splits > 1:
            merge[(num_seqs, num_q_heads)](
                out, part_acc, part_max, part_sum, num_q_heads, out.stride(0), out.stride(1),
                HEAD_DIM=head_dim, NUM_SPLITS=num_splits, enable_fp_fusion=FP_FUSION,
            )
    for name, tail in (("out", out_tail), ("part_max", max_tail), ("part_sum", sum_tail), ("part_acc", acc_tail)):
        if not bool(torch.isnan(tail.float()).all()):
            raise RuntimeError(f"the kernel wrote past the end of {name}: a store reached rows that do not exist "
                               "(query heads past the group's GROUP, or past the last sequence)")
    result = out.to(home)
    if partials:
        return result, (part_max.cpu(), part_sum.cpu(), part_acc.cpu())
    return result


def paged_decode_with_partials(kernel: Any, merge: Any, *args: Any) -> Any:
    """:func:`paged_decode` with ``partials=True``: ``(out, (max, sum, acc))`` (what exercise 09's check reads)."""
    return paged_decode(kernel, merge, *args, partials=True)


def _with_tail(shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device, tail: int,
               fill: float = float("nan")) -> Tuple[torch.Tensor, torch.Tensor]:
    """A contiguous tensor of ``shape`` followed in memory by ``tail`` more elements; returns both views."""
    size = math.prod(shape)
    flat = torch.full((size + tail,), fill, dtype=dtype, device=device)
    return flat[:size].view(shape), flat[size:]


def _guarded(cache: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``cache`` inside a NaN buffer: GUARD_BLOCKS before, the trap block and GUARD_BLOCKS after."""
    num_blocks = cache.shape[0]
    buffer = torch.full((GUARD_BLOCKS + num_blocks + 1 + GUARD_BLOCKS, *cache.shape[1:]), float("nan"),
                        dtype=cache.dtype, device=device)
    buffer[GUARD_BLOCKS:GUARD_BLOCKS + num_blocks] = cache.to(device)
    return buffer[GUARD_BLOCKS:]
