"""Task 08.4's contract for ids that name no sequence, checked on the learner's class before the simulation.

The simulator never asks about an unknown sequence, so a class could serve it perfectly and still break
the contract: ``append_tokens`` and ``get_block_mapping`` of an unknown id raise ``ValueError`` and change
nothing; ``free_sequence`` of one is a no-op.
"""

from __future__ import annotations

from typing import Any

from ._common import call_learner, expect_raises, fail

NAME = "MyAllocator"


def expect_unknown_sequences_refused(cls: Any) -> None:
    """Raise a check failure when the learner's class mishandles an unknown sequence id."""
    setup = f"a = {NAME}(8, 4); a.allocate_for_sequence(0, 5)"
    mine = call_learner(cls, (8, 4), f"{NAME}(8, 4)", "an allocator")
    call_learner(mine.allocate_for_sequence, (0, 5), setup, None)
    before = (call_learner(mine.get_block_mapping, (0,), f"{setup}; a.get_block_mapping(0)", [0, 1]),
              mine.num_free_blocks)
    for method, args, what in (("get_block_mapping", (7,), "has no mapping"),
                               ("append_tokens", (7,), "cannot grow"),
                               ("append_tokens", (7, 3), "cannot grow")):
        call = f"{setup}; a.{method}({', '.join(map(str, args))})"
        expect_raises(getattr(mine, method), args, call, ValueError,
                      f"sequence 7 was never allocated, so it {what}: raise ValueError (and change nothing)")
    call_learner(mine.free_sequence, (7,), f"{setup}; a.free_sequence(7)", None)
    after = (call_learner(mine.get_block_mapping, (0,), f"{setup}; a.get_block_mapping(0)", before[0]),
             mine.num_free_blocks)
    if after != before:
        raise fail(f"{setup}; then calls on the unknown sequence 7  -> (a.get_block_mapping(0), a.num_free_blocks)",
                   before, after, "a call about a sequence that does not exist must change nothing "
                   "(free_sequence of an unknown id does nothing at all)")
