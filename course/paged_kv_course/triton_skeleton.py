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

import contextlib
import math
import os
from typing import Any, Callable, Iterator, List, Tuple

import numpy as np

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


# The oldest Triton whose interpreter runs these launchers: exercise 10's capstone with the reference 09.4 kernels
# failed inside the interpreter with 3.0.0, 3.4.0, 3.5.1 and 3.6.0, and ran with 3.7.0, 3.8.0 and 3.9.0.
# pyproject's range stays wider: on a GPU, torch's CUDA build pins its Triton, and compiled kernels do not go
# through the interpreter.
INTERPRETER_MIN_TRITON = (3, 7)


class TritonTooOldError(RuntimeError):
    """Triton's interpreter is on and its version is older than :data:`INTERPRETER_MIN_TRITON`."""


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
    version = tuple(int(part) for part in triton.__version__.split("+")[0].split(".")[:2] if part.isdigit())
    if type(obj) is not JITFunction and version < INTERPRETER_MIN_TRITON:
        least = ".".join(map(str, INTERPRETER_MIN_TRITON))
        raise TritonTooOldError(f"Triton {triton.__version__}'s interpreter cannot run this course's kernels "
                                f"(Triton {least} or newer can): pip install -U 'triton>={least}', then restart "
                                "the kernel")


# --------------------------------------------------------------------------- what a kernel reads (interpreter)
# A region: (first byte, end byte, name, the lanes of it that must not be read (byte offsets -> bool)).
Region = Tuple[int, int, str, Callable[[np.ndarray], np.ndarray]]


class _Remap:
    """The two caches as the kernel sees them with a block stride far larger than their memory's.

    Both live in one buffer, k's blocks then v's (``gap`` elements after k's base); the kernel is
    told a block stride of ``stride`` elements, and an address in that stretched range is read from
    the compact copy, so offsets past 2**31 elements cost no memory."""

    def __init__(self, base: int, element: int, stride: int, real_stride: int, gap: int, first: int, end: int):
        self.base, self.element, self.stride, self.real_stride, self.gap = base, element, stride, real_stride, gap
        self.first, self.end = first, end  # block ids that exist around a cache (the NaN guards included)

    def span(self) -> Tuple[int, int]:
        return (self.base + self.first * self.stride * self.element,
                self.base + (self.end * self.stride + self.gap) * self.element)

    def real(self, addresses: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(real addresses, whether each exists) of stretched ``addresses``."""
        offset = (addresses.astype(np.int64) - self.base) // self.element
        block, rest = np.divmod(offset, self.stride)
        in_v = (rest >= self.gap) & (rest < self.gap + self.real_stride)
        ok = ((rest < self.real_stride) | in_v) & (block >= self.first) & (block < self.end)
        real = self.base + (block * self.real_stride + rest) * self.element  # v: rest holds the gap already
        return np.where(ok, real, self.base).astype(np.uint64), ok


@contextlib.contextmanager
def _watched_loads(regions: List[Region], known: List[Tuple[int, int]],
                   remaps: List[_Remap]) -> Iterator[List[str]]:
    """Under the interpreter: every load of the launch is looked at before it is made. A lane in a
    region it must not read is named (once); a lane in no buffer at all reads NaN and is named
    (it would be a fault on a GPU, or another tensor's data); stretched caches are read through
    their compact copies. Yields the names found. On a GPU nothing is watched (yields [])."""
    found: List[str] = []
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield found
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    plain = builder.create_masked_load
    spans = [r.span() for r in remaps]

    def load(ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        addresses = np.asarray(ptrs.data)
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        flat = addresses.astype(np.int64)
        for start, end, name, bad in regions:
            inside = live & (flat >= start) & (flat < end)
            if inside.any() and name not in found and bool(bad(flat[inside] - start).any()):
                found.append(name)
        lost = live.copy()
        for start, end in known:
            lost &= ~((flat >= start) & (flat < end))
        moved = addresses.copy()
        for remap, (start, end) in zip(remaps, spans):
            inside = lost & (flat >= start) & (flat < end)  # a real buffer's bytes are read as they are
            if inside.any():
                real, ok = remap.real(addresses[inside])
                moved[inside] = real
                lost[inside] = ~ok
        if lost.any():
            if "outside" not in found:
                found.append("outside")
            moved[lost] = known[0][0]  # a byte that exists; the lane's value is replaced below
        result = plain(interpreter.TensorHandle(moved, ptrs.dtype), mask, other, *rest)
        if lost.any():
            data = np.array(result.data, copy=True)
            data[np.broadcast_to(lost, data.shape)] = np.nan if data.dtype.kind == "f" else -(2 ** 30)
            result.data = data
        return result

    builder.create_masked_load = load
    try:
        yield found
    finally:
        del builder.create_masked_load


def _bytes(t: torch.Tensor) -> Tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


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
        tl.static_assert(len(m_i.shape) == 1 and len(l_i.shape) == 1 and len(acc.shape) == 1,
                         "fold_tile returned a state of other shapes than it was given: m and l stay [1], acc [D] "
                         "(a reduction over the whole tile gives a 0-d value: keep the state's shapes)")
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
    block_stride: int = 0,
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
    ``(max, sum, acc)`` as the kernel left them (NaN where it wrote nothing), and the names of what
    the kernel read that it should not have (under the interpreter: ``"query"`` rows past the last
    query head, ``"table"`` entries past a row's width or past the last row, ``"outside"`` every
    buffer). ``block_stride`` (interpreter only) tells the kernel the caches' blocks are that many
    elements apart, a stride whose offsets pass 2**31, while their memory stays compact.
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
    stretch = bool(block_stride) and os.environ.get("TRITON_INTERPRET") == "1"
    if stretch:  # one buffer, k's guarded blocks then v's, so the stretched addresses of both decode apart
        both = _guarded(torch.cat([k_cache, v_cache]), device, gap=num_blocks)
        k_view, v_view = both[:num_blocks + 1 + GUARD_BLOCKS], both[num_blocks + 1 + 2 * GUARD_BLOCKS:]
    else:
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
    width = block_tables.shape[1]
    q_flat, t_first = qd.data_ptr(), table.data_ptr()
    regions: List[Region] = [
        (q_flat + qd.numel() * qd.element_size(), q_flat + (qd.numel() + rows * head_dim) * qd.element_size(),
         "query", lambda off: np.ones(off.shape, dtype=bool)),
        (t_first, t_first + table.numel() * table.element_size(), "table",
         lambda off: ((off // table.element_size()) % table.stride(0) >= width)
         | ((off // table.element_size()) // table.stride(0) >= num_seqs)),
    ]
    buffers = [lens, table, k_view, v_view, out, part_acc, part_max, part_sum]
    known = [_bytes(qd)[0:1] + (_bytes(qd)[1] + rows * head_dim * qd.element_size(),)]
    known += [(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
              for t in buffers]
    remaps: List[_Remap] = []
    stride_kb = k_view.stride(0)
    if stretch:
        stride_kb = int(block_stride)
        remaps.append(_Remap(k_view.data_ptr(), k_view.element_size(), stride_kb, k_view.stride(0),
                             (v_view.data_ptr() - k_view.data_ptr()) // k_view.element_size(),
                             -GUARD_BLOCKS, num_blocks + 1 + GUARD_BLOCKS))
    with _watched_loads(regions, known, remaps) as reads:
        if num_seqs:
            kernel[(num_seqs, num_kv_heads, num_splits)](
                qd, k_view, v_view, table, lens, out, part_acc, part_max, part_sum,
                scale, num_blocks + 1, width, num_q_heads,
                qd.stride(0), qd.stride(1), stride_kb, k_view.stride(1), k_view.stride(2), table.stride(0),
                out.stride(0), out.stride(1),
                GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_G=rows,
                BLOCK_N=BLOCK_N, NUM_SPLITS=num_splits, enable_fp_fusion=FP_FUSION,
            )
    if num_seqs:
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
        return result, (part_max.cpu(), part_sum.cpu(), part_acc.cpu()), tuple(reads)
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


def _guarded(cache: torch.Tensor, device: torch.device, gap: int = 0) -> torch.Tensor:
    """A copy of ``cache`` inside a NaN buffer: GUARD_BLOCKS before, the trap block and GUARD_BLOCKS after.

    With ``gap``, ``cache`` is two caches of ``gap`` blocks each, guarded alike one after the other."""
    parts = [cache] if not gap else [cache[:gap], cache[gap:]]
    num_blocks = parts[0].shape[0]
    per = GUARD_BLOCKS + num_blocks + 1 + GUARD_BLOCKS
    buffer = torch.full((per * len(parts), *cache.shape[1:]), float("nan"), dtype=cache.dtype, device=device)
    for k, part in enumerate(parts):
        buffer[k * per + GUARD_BLOCKS:k * per + GUARD_BLOCKS + num_blocks] = part.to(device)
    return buffer[GUARD_BLOCKS:]
