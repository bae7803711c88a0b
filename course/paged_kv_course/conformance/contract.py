"""The checks of a learner's allocator's answers, as the adapter reads them after every call that changes it.

Each function reads the learner's object (``inner``) or a value it returned and raises
:class:`AllocatorContractError` naming the call when the answer breaks the contract in
:mod:`paged_kv_course.conformance`: a bookkeeping bug then stops the engine at the call that made
it, not with wrong text many steps later. What the answers should be comes from
the block manager's rules (:mod:`paged_kv_lib.block_manager`) and the adapter's record of the tables; nothing here decides
a block id.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

from paged_kv_lib.block import blocks_needed

__all__ = [
    "AllocatorContractError",
    "cached_count",
    "check_fresh",
    "check_free_count",
    "check_growth",
    "check_returned",
    "check_unchanged",
    "free_count",
    "read_mapping",
]


class AllocatorContractError(AssertionError):
    """The learner's allocator answered something the contract rules out (a bookkeeping bug)."""


def free_count(inner: Any, call: str) -> int:
    """The learner's ``num_free_blocks``, which must be an int attribute or property."""
    free = inner.num_free_blocks
    if callable(free):
        raise AllocatorContractError(f"num_free_blocks must be an int attribute or a property, got a method ({call})")
    if isinstance(free, bool) or not isinstance(free, int):
        raise AllocatorContractError(f"num_free_blocks must be an int, got {type(free).__name__} {free!r} ({call})")
    return free


def check_free_count(inner: Any, held: int, num_blocks: int, call: str) -> None:
    """The learner's free count must be the pool less the ``held`` distinct blocks the tables hold."""
    free = free_count(inner, call)
    if free != num_blocks - held:
        raise AllocatorContractError(
            f"after {call}, num_free_blocks is {free}, but the sequences hold {held} "
            f"distinct blocks of {num_blocks}: expected {num_blocks - held}"
        )


def read_mapping(inner: Any, seq_id: int, num_tokens: int, block_size: int, num_blocks: int, call: str) -> List[int]:
    """The learner's mapping of ``seq_id`` after ``call``: a list of distinct ids in the pool, exactly the
    blocks ``num_tokens`` tokens need."""
    table = inner.get_block_mapping(seq_id)
    if not isinstance(table, (list, tuple)) or any(isinstance(b, bool) or not isinstance(b, int) for b in table):
        raise AllocatorContractError(f"after {call}, get_block_mapping({seq_id}) returned {table!r}: expected a list of ints")
    table = list(table)
    want = blocks_needed(num_tokens, block_size)
    if len(table) != want:
        raise AllocatorContractError(
            f"after {call}, sequence {seq_id} holds {num_tokens} tokens in {len(table)} blocks {table}; "
            f"blocks of {block_size} need exactly {want}"
        )
    bad = [b for b in table if not 0 <= b < num_blocks]
    if bad:
        raise AllocatorContractError(f"after {call}, sequence {seq_id}'s mapping {table} holds ids outside 0..{num_blocks - 1}: {bad}")
    if len(set(table)) != len(table):
        raise AllocatorContractError(f"after {call}, sequence {seq_id}'s mapping {table} lists a block twice")
    return table


def cached_count(found: Any, num_tokens: int, block_size: int, call: str) -> int:
    """The learner's count of prompt tokens found cached: whole full blocks of the prompt."""
    if isinstance(found, bool) or not isinstance(found, int) or not 0 <= found <= num_tokens or found % block_size:
        raise AllocatorContractError(
            f"{call} returned {found!r}: expected the number of prompt tokens found cached, a multiple of "
            f"block_size={block_size} between 0 and {num_tokens} (whole full blocks only)"
        )
    return found


def check_fresh(block_ids: Sequence[int], holders: Mapping[int, int], tables: Mapping[int, List[int]], call: str) -> None:
    """Blocks just handed out must be held by no other sequence."""
    taken = [b for b in block_ids if holders.get(b, 0)]
    if taken:
        owners = {b: [s for s, t in tables.items() if b in t] for b in taken}
        raise AllocatorContractError(f"{call} handed out blocks other sequences still hold: {owners} (block -> holders)")


def check_growth(before: List[int], after: List[int], must_copy: bool, tail_holders: int, call: str) -> List[Tuple[int, int]]:
    """The blocks a growth replaced, ``(old, new)``: exactly the last one when the rules say it is copied, else none."""
    replaced = [(old, new) for old, new in zip(before, after) if old != new]
    if must_copy and not replaced:
        raise AllocatorContractError(
            f"{call} wrote into block {before[-1]}, which {tail_holders} sequences hold and "
            "which is not full: no copy-on-write (the writer must get a private copy first)"
        )
    if replaced and (not must_copy or replaced != [(before[-1], after[len(before) - 1])]):
        raise AllocatorContractError(
            f"{call} replaced blocks {[old for old, _ in replaced]} of {before}: only a shared, not full "
            "last block is copied on write"
        )
    return replaced


def check_returned(returned: Any, placed: List[int], before: List[int], after: List[int], call: str) -> None:
    """``append_tokens`` returns the blocks newly placed in the mapping (copies and new blocks), in any order."""
    if not isinstance(returned, (list, tuple)) or sorted(returned) != sorted(placed):
        raise AllocatorContractError(
            f"{call} returned {returned!r}, but the mapping went from {before} to {after}: "
            f"the blocks newly placed in it are {placed}"
        )


def check_unchanged(inner: Any, tables: Dict[int, List[int]], held: int, num_blocks: int, call: str) -> None:
    """After ``call`` raised: the learner's mappings and free count must be as they were."""
    for seq_id, table in tables.items():
        got = inner.get_block_mapping(seq_id)
        if list(got) != table:
            raise AllocatorContractError(
                f"{call} raised, but changed sequence {seq_id}'s mapping from {table} to {got}: "
                "a call that fails must change nothing"
            )
    check_free_count(inner, held, num_blocks, call + " (which raised)")
