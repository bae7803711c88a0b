"""What one paged forward knows about its batch, built once per step and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from ..attention import paged_attention, paged_attention_extend, resolve_backend
from ..attention.batched import BatchPlan, plan_batch
from ..attention.batched import attend as attend_batched
from ..protocols import PagedKVView
from ..kv_cache import cache_rows, slots_from_positions


DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""Decode attention with :func:`~paged_kv_lib.attention.paged_attention`'s arguments ``(q, k_cache, v_cache,
block_tables, seq_lens)`` and result: what a caller may plug in for the library's kernel on decode steps."""


@dataclass
class PagedBatch:
    """Everything one paged forward needs about its batch, built once and shared by every layer.

    ``positions`` and ``slots`` cover the packed new tokens (``slots`` only those whose K/V
    is written: ``write_rows`` picks them, ``None`` meaning all; ``cache_rows`` are the
    slots' rows in a layer's cache, for every K/V head, computed once for every layer); ``block_tables`` and
    ``seq_lens`` are the attention's inputs; ``plan`` is the batched torch attention's
    gather index, or ``None`` when the Triton backend serves the batch; ``decode_attention``, when set,
    serves a decode batch instead of the library's attention (the capstone plugs a learner's kernel in).
    """

    decode: bool
    positions: torch.Tensor
    slots: torch.Tensor
    cache_rows: torch.Tensor
    write_rows: Optional[torch.Tensor]
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    last_rows: torch.Tensor
    max_query_len: int
    plan: Optional[BatchPlan]
    decode_attention: Optional[DecodeAttention] = None

    @classmethod
    def build(
        cls,
        allocator: PagedKVView,
        seq_ids: List[int],
        lens: List[int],
        q_lens: List[int],
        write: List[bool],
        num_kv_heads: int,
        decode_attention: Optional[DecodeAttention] = None,
    ) -> "PagedBatch":
        """The batch of ``seq_ids`` holding ``lens`` tokens, whose newest ``q_lens`` run this step.

        ``write[i]`` False: sequence ``i``'s new K/V is already cached (a prefix-cache hit).
        Inputs are assumed checked by the forward.
        """
        device = allocator.k_caches[0].device
        num_seqs, block_size = len(seq_ids), allocator.block_size
        seq_lens = torch.tensor(lens, dtype=torch.int64, device=device)
        decode = max(q_lens) == 1
        if decode:
            query_start_loc = torch.arange(num_seqs + 1, device=device)
            seq_of = query_start_loc[:-1]
            positions = seq_lens - 1
        else:
            q_lens_t = torch.tensor(q_lens, dtype=torch.int64, device=device)
            query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int64, device=device)
            torch.cumsum(q_lens_t, 0, out=query_start_loc[1:])
            seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens_t, output_size=sum(q_lens))
            within = torch.arange(seq_of.shape[0], device=device) - query_start_loc[seq_of]
            positions = (seq_lens - q_lens_t)[seq_of] + within
        block_tables = allocator.block_table_tensor(seq_ids)
        slots = slots_from_positions(block_tables, positions, block_size, rows=seq_of)
        write_rows = None
        if not all(write):
            keep = torch.tensor(write, device=device)[seq_of]
            write_rows = keep.nonzero().flatten()
            slots = slots[write_rows]
        plan = None
        if not (decode and decode_attention is not None) and resolve_backend("auto", device) == "torch":
            plan = plan_batch(block_tables, seq_lens, num_kv_heads, block_size, None if decode else query_start_loc)
        rows = cache_rows(slots, num_kv_heads, block_size)
        return cls(
            decode, positions, slots, rows, write_rows, block_tables, seq_lens.to(torch.int32),
            query_start_loc.to(torch.int32), query_start_loc[1:] - 1, max(q_lens), plan,
            decode_attention if decode else None,
        )

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Paged attention of the batch's queries over one layer's cache."""
        if self.decode_attention is not None:
            return self.decode_attention(q, k_cache, v_cache, self.block_tables, self.seq_lens)
        if self.plan is not None:  # the torch backend, with the gather index built once
            return attend_batched(q, k_cache, v_cache, self.plan)
        if self.decode:
            return paged_attention(q, k_cache, v_cache, self.block_tables, self.seq_lens)
        return paged_attention_extend(
            q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc,
            max_query_len=self.max_query_len,
        )
