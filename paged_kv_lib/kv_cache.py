"""``KVCache``: the K/V tensors of a paged cache and every move of their bytes, and the tensor operations
on the layout ``(num_blocks, num_heads, block_size, head_dim)``.

It knows the layout and nothing about which sequence owns which block: the block manager decides
*where*, this module writes and reads there. One stacked tensor ``[K|V, layer, block, head, slot, dim]``
holds every layer's K and V, so a block copy (copy-on-write) or a swap moves all layers at once;
``k_caches[l]``/``v_caches[l]`` are views of it in the seed's layout. A slot names one token position
in the pool: ``slot = block_id * block_size + offset``.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from ._validate import as_count
from .errors import CacheNotAllocatedError, InvalidArgumentError, InvalidTypeError, PositionError


def slots_from_positions(
    block_ids: torch.Tensor, positions: torch.Tensor, block_size: int, rows: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The slot of each logical position, read through block ids: the one home of the slot mapping.

    ``block_ids`` is one sequence's block ids ``[num_blocks]``, or with ``rows`` a padded
    block-table tensor ``[num_seqs, max_blocks]`` whose row ``rows[i]`` owns ``positions[i]``
    (a batch's new tokens in one call). Returns int64 ``block * block_size + offset``.
    """
    column = positions // block_size
    ids = block_ids[column] if rows is None else block_ids[rows, column]
    return ids.long() * block_size + positions % block_size


def cache_rows(slots: torch.Tensor, num_heads: int, block_size: int) -> torch.Tensor:
    """The row of every (slot, head) in a cache seen as ``[num_blocks * num_heads * block_size, head_dim]``.

    int64 ``[len(slots) * num_heads]``, slot-major: what :func:`write_rows` takes, so a caller
    writing many layers through the same slots computes it once.
    """
    heads = torch.arange(num_heads, device=slots.device)
    first = ((slots // block_size) * num_heads * block_size + slots % block_size)[:, None]
    return (first + heads[None, :] * block_size).reshape(-1)


def write_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> None:
    """Store ``k``/``v`` ``[n, num_heads, head_dim]`` at the cache rows :func:`cache_rows` gave (one copy each)."""
    head_dim = k_cache.shape[-1]
    k_cache.view(-1, head_dim).index_copy_(0, rows, k.reshape(-1, head_dim))
    v_cache.view(-1, head_dim).index_copy_(0, rows, v.reshape(-1, head_dim))


def write_slots(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Store ``k``/``v`` of shape ``[n, num_heads, head_dim]`` into the given slots."""
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        write_rows(k_cache, v_cache, cache_rows(slots, k_cache.shape[1], k_cache.shape[2]), k, v)
        return
    block_size = k_cache.shape[2]
    blocks = slots // block_size
    offsets = slots % block_size
    # Advanced indices on dims 0 and 2 around a slice put the token dim first: [n, H, D].
    k_cache[blocks, :, offsets, :] = k
    v_cache[blocks, :, offsets, :] = v


def gather_tokens(cache: torch.Tensor, block_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Read ``num_tokens`` tokens stored in ``block_ids`` back as ``[num_tokens, H, D]``."""
    num_heads, head_dim = cache.shape[1], cache.shape[3]
    blocks = cache.index_select(0, block_ids)  # [nb, H, bs, D]
    tokens = blocks.permute(0, 2, 1, 3).reshape(-1, num_heads, head_dim)
    return tokens[:num_tokens].contiguous()


def copy_blocks(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks ``src[i] -> dst[i]`` in every layer, K and V, of a stacked cache.

    ``kv`` is ``[2, num_layers, num_blocks, H, bs, D]``: one indexed copy moves everything
    (this is copy-on-write's copy).
    """
    kv[:, :, dst] = kv[:, :, src]


def transfer_blocks(src_kv: torch.Tensor, src: torch.Tensor, dst_kv: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy blocks between two stacked caches, possibly on different devices (swapping)."""
    moved = src_kv[:, :, src.to(src_kv.device)]
    dst_kv[:, :, dst.to(dst_kv.device)] = moved.to(dst_kv.device)


def padded_block_tables(tables: Sequence[Sequence[int]], device: torch.device, *,
                        max_blocks: Optional[int] = None) -> torch.Tensor:
    """Block tables as the int32 ``[len(tables), width]`` tensor ``block_table_tensor`` returns.

    Rows are padded with -1; ``width`` is the longest table, or ``max_blocks`` (a fixed width
    suits kernels captured once for many steps), which may not be shorter.
    """
    longest = max((len(t) for t in tables), default=0)
    width = longest if max_blocks is None else as_count(max_blocks, "max_blocks")
    if width < longest:
        raise InvalidArgumentError(f"max_blocks={width} is less than the longest table ({longest} blocks)")
    rows = [list(t) + [-1] * (width - len(t)) for t in tables]
    out = torch.tensor(rows, dtype=torch.int32) if rows else torch.empty((0, width), dtype=torch.int32)
    return out.reshape(len(tables), width).to(device)


Positions = Union[int, Sequence[int], range, torch.Tensor]


class KVCache:
    """Preallocated K/V tensors for ``num_blocks`` blocks (and an optional CPU swap pool).

    With ``allocate_cache=False`` it holds no tensors (bookkeeping-only simulations):
    address translation still works, reading or writing K/V raises
    :class:`CacheNotAllocatedError`.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device] = "cpu",
        *,
        num_layers: int = 1,
        num_cpu_blocks: int = 0,
        allocate_cache: bool = True,
    ) -> None:
        self.num_blocks = as_count(num_blocks, "num_blocks", minimum=1)
        self.block_size = as_count(block_size, "block_size", minimum=1)
        self.num_heads = as_count(num_heads, "num_heads", minimum=1)
        self.head_dim = as_count(head_dim, "head_dim", minimum=1)
        self.num_layers = as_count(num_layers, "num_layers", minimum=1)
        self.num_cpu_blocks = as_count(num_cpu_blocks, "num_cpu_blocks")
        if not isinstance(dtype, torch.dtype):
            raise InvalidTypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)
        self.kv: Optional[torch.Tensor] = None
        self.cpu_kv: Optional[torch.Tensor] = None
        self.k_caches: Tuple[torch.Tensor, ...] = ()
        self.v_caches: Tuple[torch.Tensor, ...] = ()
        if allocate_cache:
            per_block = (self.num_heads, self.block_size, self.head_dim)
            self.kv = torch.zeros((2, self.num_layers, self.num_blocks, *per_block), dtype=dtype, device=self.device)
            self.k_caches = tuple(self.kv[0].unbind(0))
            self.v_caches = tuple(self.kv[1].unbind(0))
            if self.num_cpu_blocks:
                pin = torch.cuda.is_available()
                self.cpu_kv = torch.zeros((2, self.num_layers, self.num_cpu_blocks, *per_block), dtype=dtype,
                                          pin_memory=pin)

    # ------------------------------------------------------------------ checks
    def layer(self, layer: int) -> int:
        """``layer`` checked against the cache (which must exist)."""
        if self.kv is None:
            raise CacheNotAllocatedError("this allocator was built with allocate_cache=False: it holds no K/V")
        layer = as_count(layer, "layer")
        if layer >= self.num_layers:
            raise InvalidArgumentError(f"layer {layer} out of range: the cache has {self.num_layers} layers")
        return layer

    def positions(self, seq_id: int, num_tokens: int, positions: Positions) -> torch.Tensor:
        """Logical positions of a sequence holding ``num_tokens`` tokens, checked, as int64 on the cache device."""
        if isinstance(positions, torch.Tensor):
            if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
                raise InvalidTypeError(f"positions must hold integers, got dtype {positions.dtype}")
            pos = positions.reshape(-1).to(device=self.device, dtype=torch.int64)
        else:
            items = [positions] if isinstance(positions, int) or hasattr(positions, "__index__") else positions
            values = [as_count(p, "position", minimum=-(2**62)) for p in items]
            pos = torch.tensor(values, dtype=torch.int64, device=self.device)
        if pos.numel():
            low, high = int(pos.min()), int(pos.max())
            if low < 0 or high >= num_tokens:
                bad = low if low < 0 else high
                raise PositionError(
                    f"position {bad} is outside sequence {seq_id}, which holds "
                    f"{num_tokens} tokens (valid: 0..{num_tokens - 1})"
                )
        return pos

    def check_kv(self, k: torch.Tensor, v: torch.Tensor, num_tokens: int) -> None:
        """Refuse K/V that is not ``[num_tokens, num_heads, head_dim]`` of the cache's dtype and device."""
        expected = (num_tokens, self.num_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != expected:
                raise InvalidArgumentError(
                    f"{name} has shape {tuple(t.shape)}, expected {expected} [n, num_heads, head_dim]"
                )
            if t.dtype != self.dtype:
                raise InvalidTypeError(f"{name} has dtype {t.dtype}, the cache holds {self.dtype}")
            if t.device != self.device:
                raise InvalidArgumentError(f"{name} is on {t.device}, the cache is on {self.device}")

    # ------------------------------------------------------------------ bytes
    def ids(self, block_ids: List[int]) -> torch.Tensor:
        """Block ids as an int64 tensor on the cache device."""
        return torch.tensor(block_ids, dtype=torch.int64, device=self.device)

    def slots(self, block_ids: List[int], positions: torch.Tensor) -> torch.Tensor:
        """Slots of logical positions through a sequence's block ids."""
        return slots_from_positions(self.ids(block_ids), positions, self.block_size)

    def write(self, block_ids: List[int], positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        """Store ``k``/``v`` at a sequence's (checked) logical positions in one layer."""
        write_slots(self.k_caches[layer], self.v_caches[layer], self.slots(block_ids, positions), k, v)

    def gather(self, block_ids: List[int], num_tokens: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """A sequence's first ``num_tokens`` K and V in one layer, contiguous ``[num_tokens, H, D]``."""
        ids = self.ids(block_ids)
        return gather_tokens(self.k_caches[layer], ids, num_tokens), gather_tokens(self.v_caches[layer], ids, num_tokens)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block ``src`` into ``dst`` in every layer, K and V (copy-on-write's copy); no-op without tensors."""
        if self.kv is not None:
            copy_blocks(self.kv, torch.tensor([src], device=self.device), torch.tensor([dst], device=self.device))

    def swap_out(self, device_ids: List[int], cpu_ids: List[int]) -> None:
        """Copy device blocks into CPU blocks (all layers); no-op without tensors."""
        if self.kv is not None and self.cpu_kv is not None and device_ids:
            transfer_blocks(self.kv, torch.tensor(device_ids), self.cpu_kv, torch.tensor(cpu_ids))

    def swap_in(self, cpu_ids: List[int], device_ids: List[int]) -> None:
        """Copy CPU blocks back into device blocks (all layers); no-op without tensors."""
        if self.kv is not None and self.cpu_kv is not None and cpu_ids:
            transfer_blocks(self.cpu_kv, torch.tensor(cpu_ids), self.kv, torch.tensor(device_ids))
