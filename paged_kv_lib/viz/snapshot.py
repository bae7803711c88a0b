"""Plain-data pictures of an allocator's state: what the views draw, before any drawing.

Each function reads only the allocator's public, copy-returning properties (``blocks``,
``free_blocks``, ``sequence_block_tables``, ``seq_ids``, ``block_size``), so it works for
any allocator with the seed's API and can never change the allocator. The results are
lists of dicts, easy to print in a lesson and to check in a test.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..block import tokens_in_blocks
from ..errors import PositionError, UnknownSequenceError

BlockInfo = Dict[str, Any]

FREE, CACHED, USED = "free", "cached", "used"


def short_hash(block_hash: Any) -> Optional[str]:
    """The first 8 hex digits of a block's prefix-cache hash (``None`` when it has none)."""
    if block_hash is None:
        return None
    if isinstance(block_hash, (bytes, bytearray)):
        return bytes(block_hash).hex()[:8]
    if isinstance(block_hash, int):
        return f"{block_hash & 0xFFFFFFFF:08x}"
    return str(block_hash)[:8]


def sequence_rows(allocator: Any) -> List[Dict[str, Any]]:
    """One dict per sequence (oldest first): its tokens and its logical -> physical blocks.

    ``blocks`` lists ``{"logical", "block_id", "fill", "ref_count", "shared"}`` in logical
    order; ``fill`` counts this sequence's tokens in that block.
    """
    ref_counts = {b.block_id: b.ref_count for b in allocator.blocks}
    tables = allocator.sequence_block_tables
    rows = []
    for seq_id in allocator.seq_ids:
        table = tables[seq_id]
        fills = tokens_in_blocks(table.num_tokens, len(table.block_ids), allocator.block_size)
        rows.append(
            {
                "seq_id": seq_id,
                "num_tokens": table.num_tokens,
                "blocks": [
                    {
                        "logical": i,
                        "block_id": block_id,
                        "fill": fill,
                        "ref_count": ref_counts[block_id],
                        "shared": ref_counts[block_id] > 1,
                    }
                    for i, (block_id, fill) in enumerate(zip(table.block_ids, fills))
                ],
            }
        )
    return rows


def swapped_rows(allocator: Any) -> List[Dict[str, Any]]:
    """Sequences swapped out to the CPU pool (they hold no device blocks): id and token count."""
    return [
        {"seq_id": seq_id, "num_tokens": allocator.get_num_tokens(seq_id)}
        for seq_id in getattr(allocator, "swapped_seq_ids", ())
    ]


def pool_blocks(allocator: Any) -> List[BlockInfo]:
    """One dict per physical block, by block id: who holds it, its state and how full it is.

    ``state`` is ``"used"`` (some table holds it), ``"cached"`` (free, but it keeps a hash,
    so a later prompt with the same prefix can take it back) or ``"free"``. ``fill`` is the
    most tokens any owner keeps in it; a cached block is full (only full blocks get a hash).
    """
    owners: Dict[int, List[int]] = {}
    fill: Dict[int, int] = {}
    for row in sequence_rows(allocator):
        for entry in row["blocks"]:
            owners.setdefault(entry["block_id"], []).append(row["seq_id"])
            fill[entry["block_id"]] = max(fill.get(entry["block_id"], 0), entry["fill"])
    size = allocator.block_size
    infos = []
    for block in allocator.blocks:
        if block.ref_count > 0:
            state = USED
        elif block.block_hash is not None:
            state = CACHED
        else:
            state = FREE
        infos.append(
            {
                "block_id": block.block_id,
                "state": state,
                "owners": tuple(owners.get(block.block_id, ())),
                "ref_count": block.ref_count,
                "fill": size if state == CACHED else fill.get(block.block_id, 0),
                "block_size": size,
                "hash": short_hash(block.block_hash),
            }
        )
    return infos


def free_queue_entries(allocator: Any) -> List[Dict[str, Any]]:
    """The free queue from head (handed out next) to tail, each entry plain free or cached."""
    hashes = {b.block_id: b.block_hash for b in allocator.blocks}
    return [
        {
            "position": i,
            "block_id": block_id,
            "state": CACHED if hashes[block_id] is not None else FREE,
            "hash": short_hash(hashes[block_id]),
        }
        for i, block_id in enumerate(allocator.free_blocks)
    ]


def translate(allocator: Any, seq_id: int, position: int) -> Dict[str, Any]:
    """Address translation of one token: logical block and offset, physical block, slot.

    ``logical_block = position // block_size``, ``offset = position % block_size``, the
    block table maps the logical block to ``block_id``, and ``slot = block_id *
    block_size + offset`` names the token's row in the flat cache.
    """
    tables = allocator.sequence_block_tables
    if seq_id not in tables:
        raise UnknownSequenceError(f"sequence {seq_id!r} is not allocated")
    table = tables[seq_id]
    if not 0 <= position < table.num_tokens:
        raise PositionError(
            f"position {position} is outside sequence {seq_id}, which holds {table.num_tokens} tokens"
        )
    size = allocator.block_size
    logical, offset = divmod(position, size)
    block_id = table.block_ids[logical]
    return {
        "seq_id": seq_id,
        "position": position,
        "num_tokens": table.num_tokens,
        "block_size": size,
        "logical_block": logical,
        "offset": offset,
        "block_id": block_id,
        "slot": block_id * size + offset,
    }
