"""The scheduler's questions to a :class:`~paged_kv_lib.block_manager.BlockManager`, answered from its state.

Can a new sequence (or several) be allocated, can these sequences grow this step and by how
much, can they swap out or back in, can a request ever fit: each answer reads the manager's
tables, ref counts and free counts and hands the numbers to :mod:`paged_kv_lib.block_rules`,
the one home of the arithmetic (the learner's adapter asks the same functions). Nothing here
changes any state. :class:`BlockQuestions` is mixed into ``BlockManager``, which supplies what
the ``TYPE_CHECKING`` block declares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import block_rules as rules
from ._validate import as_count, as_iterable, as_token_ids
from .block import Block, blocks_needed
from .block_table import BlockTable
from .bookkeeping import TokenIds
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .prefix_cache import PromptPlan

ExtraKey = Optional[Union[bytes, str]]

__all__ = ["BlockQuestions"]


class BlockQuestions:
    """The question methods of ``BlockManager`` (the :class:`~paged_kv_lib.bookkeeping.EngineBookkeeping` ones)."""

    if TYPE_CHECKING:  # what the block manager provides
        num_blocks: int
        block_size: int
        _blocks: List[Block]

        @property
        def num_free_blocks(self) -> int: ...

        @property
        def num_free_cpu_blocks(self) -> int: ...

        def table(self, seq_id: int) -> BlockTable: ...

        def _swapped_table(self, seq_id: int) -> BlockTable: ...

        def _plan_prompt(self, num_tokens: int, token_ids: TokenIds, extra_key: ExtraKey) -> PromptPlan: ...

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return blocks_needed(num_tokens, self.block_size)

    def watermark_blocks(self, watermark: float) -> int:
        """Blocks an admission must leave free: ``ceil(watermark * num_blocks)`` (typed errors for a bad watermark)."""
        return rules.watermark_blocks(watermark, self.num_blocks)

    def can_allocate(self, num_tokens: int, *, token_ids: TokenIds = None, watermark: float = 0.0,
                     extra_key: ExtraKey = None) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits now, cache hits counted, leaving the watermark."""
        num_tokens = as_count(num_tokens, "num_tokens")
        reserve = self.watermark_blocks(watermark)
        plan = self._plan_prompt(num_tokens, token_ids, extra_key)
        return rules.fits(self.num_free_blocks, plan.taken_from_free, reserve)

    def blocks_to_append(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks ``append_tokens(seq_id, num_tokens)`` would take now: new blocks, plus one to copy
        a shared, non-full last block. For this sequence alone (:meth:`can_append` counts shared tails once).
        """
        table = self.table(seq_id)
        new_blocks, copy = self._append_cost(table, as_count(num_tokens, "num_tokens"))
        return new_blocks + copy

    def can_append(self, seq_ids: Iterable[int], num_tokens: int = 1, *, watermark: float = 0.0) -> bool:
        """Whether every listed sequence can grow by ``num_tokens`` in the same step, leaving the watermark.

        A tail held by ``r`` tables and grown by ``k`` of them is copied ``min(k, r - 1)``
        times: the last holder writes in place. An id listed twice is refused.
        """
        num_tokens = as_count(num_tokens, "num_tokens")
        reserve = self.watermark_blocks(watermark)
        needed = 0
        growers: Dict[int, int] = {}  # shared, non-full tail block -> how many listed sequences grow it
        seen = set()
        for seq_id in as_iterable(seq_ids, "seq_ids"):
            table = self.table(seq_id)
            if seq_id in seen:
                raise InvalidArgumentError(f"sequence {seq_id} is listed twice in can_append")
            seen.add(seq_id)
            new_blocks, copy = self._append_cost(table, num_tokens)
            needed += new_blocks
            if copy:
                tail = table.block_ids[-1]
                growers[tail] = growers.get(tail, 0) + 1
        needed += rules.shared_tail_copies((k, self._blocks[tail].ref_count) for tail, k in growers.items())
        return rules.fits(self.num_free_blocks, needed, reserve)

    def appendable_tokens(self, seq_id: int, up_to: int, *, watermark: float = 0.0) -> int:
        """The most tokens, at most ``up_to``, the sequence can grow by now and leave the watermark free.

        The chunked-prefill question: how much of a prompt's next chunk fits this step. It counts
        what :meth:`append_tokens` would take: room left in the last block, whole new blocks, and a
        copy of a shared, non-full last block.
        """
        table = self.table(seq_id)
        up_to = as_count(up_to, "up_to")
        spare = self.num_free_blocks - self.watermark_blocks(watermark)
        _, copy = self._append_cost(table, up_to)
        return rules.appendable_tokens(table.num_tokens, len(table.block_ids), self.block_size, spare, copy, up_to)

    def cached_prefix_tokens(self, token_ids: Sequence[int], *, extra_key: ExtraKey = None) -> int:
        """How many leading tokens of a prompt the prefix cache holds now (whole blocks); changes nothing."""
        tokens = as_token_ids(token_ids, len(token_ids)) if hasattr(token_ids, "__len__") else None
        if tokens is None:
            raise InvalidArgumentError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
        return len(self._plan_prompt(len(tokens), tokens, extra_key).hits) * self.block_size

    def can_swap_in(self, seq_id: int, *, watermark: float = 0.0) -> bool:
        """Whether a swapped-out sequence fits back now (one device block per CPU block it holds)."""
        reserve = self.watermark_blocks(watermark)
        return rules.fits(self.num_free_blocks, len(self._swapped_table(seq_id).block_ids), reserve)

    def can_swap_out(self, seq_ids: Iterable[int]) -> bool:
        """Whether the CPU pool has room for all these resident sequences at once (a private CPU block for
        every block each holds, shared ones too). Unknown, swapped-out or repeated ids raise."""
        ids = list(as_iterable(seq_ids, "seq_ids"))
        tables = [self.table(seq_id) for seq_id in ids]
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"can_swap_out got a sequence twice: {ids}")
        return rules.fits(self.num_free_cpu_blocks, rules.swap_out_blocks(len(t.block_ids) for t in tables))

    def can_allocate_many(self, num_tokens: Sequence[int], *, token_ids: Optional[Sequence[TokenIds]] = None,
                          watermark: float = 0.0, extra_key: ExtraKey = None) -> bool:
        """Whether several new sequences (``num_tokens[i]`` tokens each) fit now together, leaving the watermark.

        Cache hits are counted per sequence against today's cache, a free cached block once however
        many of them hit it; blocks one of them would find in another's fresh blocks are not counted
        (the answer may say no where allocating one by one would fit, never yes where it would not).
        """
        lengths = [as_count(n, "num_tokens") for n in as_iterable(num_tokens, "num_tokens")]
        tokens = [None] * len(lengths) if token_ids is None else list(as_iterable(token_ids, "token_ids"))
        if len(tokens) != len(lengths):
            raise InvalidArgumentError(f"got {len(tokens)} token_ids for {len(lengths)} sequences")
        reserve = self.watermark_blocks(watermark)
        new_blocks = 0
        revived: set = set()  # free cached blocks some sequence hits: taken off the free queue once
        for n, ids in zip(lengths, tokens):
            plan = self._plan_prompt(n, ids, extra_key)
            new_blocks += plan.new_blocks
            revived.update(b for b in plan.hits if self._blocks[b].ref_count == 0)
        return rules.fits(self.num_free_blocks, new_blocks + len(revived), reserve)

    def blocks_to_hold(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> int:
        """The most blocks ``num_seqs`` sequences of up to ``num_tokens`` tokens may hold (private copies), the
        watermark added: the pool serves them only if this is at most ``num_blocks``."""
        return rules.blocks_to_hold(num_tokens, num_seqs, self.block_size, self.num_blocks, watermark)

    def can_ever_fit(self, num_tokens: int, *, num_seqs: int = 1, watermark: float = 0.0) -> bool:
        """Whether ``num_seqs`` sequences of up to ``num_tokens`` tokens fit the empty pool, leaving the watermark."""
        return rules.fits(self.num_blocks, self.blocks_to_hold(num_tokens, num_seqs=num_seqs, watermark=watermark))

    def _append_cost(self, table: BlockTable, num_tokens: int) -> Tuple[int, bool]:
        """(new blocks, whether the shared last block is copied) to grow ``table`` by ``num_tokens``."""
        ids = table.block_ids
        tail_holders = self._blocks[ids[-1]].ref_count if ids else 0
        return rules.append_cost(table.num_tokens, len(ids), self.block_size, tail_holders, num_tokens)
