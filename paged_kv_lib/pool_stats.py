"""``AllocatorStats``: a snapshot of a block pool, worked out from the block manager's public view."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Dict

from .block import tokens_in_blocks

if TYPE_CHECKING:
    from .block_manager import BlockManager


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of the pool: block counts, tokens stored, sharing and caching counters."""

    total_blocks: int
    free_blocks: int
    used_blocks: int
    num_sequences: int
    tokens_stored: int
    logical_tokens: int
    utilization: float
    cached_free_blocks: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    cow_copies: int = 0
    swapped_sequences: int = 0
    cpu_free_blocks: int = 0
    cpu_total_blocks: int = 0

    @property
    def prefix_hit_rate(self) -> float:
        """Fraction of full prompt blocks looked up that were found cached."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["prefix_hit_rate"] = self.prefix_hit_rate
        return out


def pool_stats(manager: "BlockManager") -> AllocatorStats:
    """The manager's pool now. A block several tables share counts its fullest use once in ``tokens_stored``;
    ``logical_tokens`` counts every sequence's tokens."""
    fill: Dict[int, int] = {}
    logical = 0
    tables = [manager.table(seq_id) for seq_id in manager.seq_ids]  # live tables, read only (no copies)
    for table in tables:
        logical += table.num_tokens
        for block_id, here in zip(table.block_ids, tokens_in_blocks(table.num_tokens, len(table), manager.block_size)):
            if here > fill.get(block_id, 0):
                fill[block_id] = here
    stored = sum(fill.values())
    used = manager.num_used_blocks
    queries, hits = manager.prefix_counters
    return AllocatorStats(
        total_blocks=manager.num_blocks,
        free_blocks=manager.num_free_blocks,
        used_blocks=used,
        num_sequences=len(tables),
        tokens_stored=stored,
        logical_tokens=logical,
        utilization=stored / (used * manager.block_size) if used else 0.0,
        cached_free_blocks=manager.num_cached_free_blocks,
        prefix_queries=queries,
        prefix_hits=hits,
        cow_copies=manager.num_copies,
        swapped_sequences=len(manager.swapped_seq_ids),
        cpu_free_blocks=manager.num_free_cpu_blocks,
        cpu_total_blocks=manager.num_cpu_blocks,
    )
