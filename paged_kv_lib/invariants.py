"""The block manager's invariants, checked from scratch (a test and debugging aid; it never should fail).

* free + used == total, and a block is in exactly one state: free (possibly still cached)
  or referenced;
* a block's ref count == the number of resident tables holding it;
* a block carries a hash exactly when the prefix cache maps that hash to it, and a held
  block with a hash is full in every table that holds it;
* every table holds ``ceil(tokens / block_size)`` blocks, or one more (an empty reserve
  when the last is full), and its token ids and keys match its token count;
* the CPU pool: each CPU block free or held by one swapped table, never both; no sequence
  is both resident and swapped out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .block import cdiv
from .block_table import BlockTable
from .errors import InvariantError

if TYPE_CHECKING:
    from .block_manager import BlockManager


def check_invariants(manager: "BlockManager") -> None:
    """Raise :class:`InvariantError` naming the first inconsistency found in ``manager``."""
    try:
        manager._free.check()
    except AssertionError as exc:
        raise InvariantError(f"free queue: {exc}") from None
    blocks, block_size = manager._blocks, manager.block_size
    holders = [0] * manager.num_blocks
    full_in_all = [True] * manager.num_blocks
    for seq_id, table in manager._tables.items():
        _check_table(manager, seq_id, table)
        for i, block_id in enumerate(table.block_ids):
            holders[block_id] += 1
            if (i + 1) * block_size > table.num_tokens:
                full_in_all[block_id] = False
    for block in blocks:
        if block.ref_count != holders[block.block_id]:
            raise InvariantError(
                f"block {block.block_id} has ref_count {block.ref_count} but {holders[block.block_id]} tables hold it"
            )
        queued = block.block_id in manager._free
        if queued == (block.ref_count > 0):
            state = "queued as free" if queued else "missing from the free queue"
            raise InvariantError(f"block {block.block_id} has ref_count {block.ref_count} but is {state}")
        if block.block_hash is not None:
            if manager._prefix.get(block.block_hash) != block.block_id:
                raise InvariantError(f"block {block.block_id} has a hash the prefix cache does not map to it")
            if block.ref_count and not full_in_all[block.block_id]:
                raise InvariantError(f"block {block.block_id} carries a hash but is not full")
    for key, block_id in manager._prefix.items():
        if blocks[block_id].block_hash != key:
            raise InvariantError(f"prefix cache maps a key to block {block_id}, which has another hash")
    if len(manager._free) + sum(1 for b in blocks if b.ref_count) != manager.num_blocks:
        raise InvariantError("free + used blocks != total")
    swap = manager._swap
    cpu_used = [b for t in swap.tables.values() for b in t.block_ids]
    if len(set(cpu_used)) != len(cpu_used) or set(cpu_used) & set(swap.free):
        raise InvariantError("a CPU block is held twice, or held and free")
    if len(cpu_used) + len(swap.free) != manager.num_cpu_blocks:
        raise InvariantError("CPU free + used blocks != total")
    for seq_id, table in swap.tables.items():
        _check_table(manager, seq_id, table)
    if set(manager._tables) & set(swap.tables):
        raise InvariantError("a sequence is both resident and swapped out")


def _check_table(manager: "BlockManager", seq_id: int, table: BlockTable) -> None:
    ids, block_size = table.block_ids, manager.block_size
    least = cdiv(table.num_tokens, block_size)
    if not least <= len(ids) <= least + 1:
        raise InvariantError(f"sequence {seq_id} has {table.num_tokens} tokens in {len(ids)} blocks")
    if len(ids) == least + 1 and table.num_tokens % block_size:
        raise InvariantError(f"sequence {seq_id} reserved a block while its last one has room")
    if table.token_ids is not None:
        if len(table.token_ids) != table.num_tokens:
            raise InvariantError(f"sequence {seq_id} holds {len(table.token_ids)} token ids for {table.num_tokens} tokens")
        if len(table.block_keys) != table.num_tokens // block_size:
            raise InvariantError(f"sequence {seq_id} has {len(table.block_keys)} keys for its full blocks")
