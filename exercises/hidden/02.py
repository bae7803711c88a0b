"""Hidden cases of exercise 02: official grading only (``paged-kv release`` leaves this folder out).

The visible checks use small numbers; this case uses block sizes where float arithmetic
loses the last unit (past 2**53), which the contract allows (02.1 accepts any positive int).
"""

from __future__ import annotations

from typing import Any

from paged_kv_lib.allocator import PagedKVCacheAllocator
from paged_kv_lib.grading._common import call_learner, expect_equal, passed
from paged_kv_lib.grading.checks_02 import Script
from paged_kv_lib.grading.hidden import case


@case("02.3", points=1, hint="block_of with a block size past 2**53: keep to integer arithmetic (// and %)")
def block_of_past_float_precision(MyAllocator: Any) -> None:
    block_size = 2**53 + 1
    a = Script(MyAllocator, 3, block_size)
    ref = PagedKVCacheAllocator(3, block_size, 1, 1, allocate_cache=False, enable_prefix_caching=False)
    a.call("allocate_for_sequence", 0, 2 * block_size)
    ref.allocate_for_sequence(0, 2 * block_size)
    table = ref.get_block_mapping(0)
    for position in (0, block_size - 1, block_size, 2 * block_size - 1):
        want = table[position // block_size]
        call = f"{a.where()}; a.block_of(0, {position})"
        got = call_learner(a.attribute("block_of"), (0, position), call, want)
        expect_equal(call, want, got, "the block of a position is its table's entry position // block_size")
    passed("02.3")
