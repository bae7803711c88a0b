"""Hidden cases of exercise 04: official grading only (``paged-kv release`` leaves this folder out).

The visible checks use pools of a few hundred slots; this case uses a cache of more than
2**31 slots (a few thousand blocks of 2**20 slots), where slot numbers no longer fit int32.
"""

from __future__ import annotations

from typing import Any, Callable

from paged_kv_lib.allocator import PagedKVCacheAllocator
from paged_kv_course.grading._common import call_learner, expect_equal, expect_tensor, passed
from paged_kv_course.grading.hidden import case


@case("04.1", points=1, hint="a cache of more than 2**31 slots: compute slots in int64 all the way")
def slots_past_int32(my_step_slot_mapping: Callable[..., Any]) -> None:
    block_size = 2**20
    alloc = PagedKVCacheAllocator(4100, block_size, 1, 1, allocate_cache=False, enable_prefix_caching=False)
    alloc.allocate_for_sequence(0, 4000 * block_size)
    alloc.allocate_for_sequence(1, 3 * block_size + 5)
    tables = [alloc.get_block_mapping(1), alloc.get_block_mapping(0)[-2:]]
    done, new = [3 * block_size - 2, 0], [7, 0]
    want = alloc.slot_mapping(1, list(range(done[0], done[0] + new[0])))
    call = f"my_step_slot_mapping({tables}, num_computed={done}, num_new={new}, block_size={block_size})"
    got = call_learner(my_step_slot_mapping, ([list(t) for t in tables], list(done), list(new), block_size), call,
                       want)
    expect_tensor(call, got, dtype=want.dtype, shape=tuple(want.shape),
                  hint="slots are int64")
    expect_equal(call, want, got, "slot = block_id * block_size + offset: compute it in int64 all the way")
    passed("04.1")
