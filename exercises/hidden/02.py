"""Hidden cases of exercise 02: official grading only (``paged-kv release`` leaves this folder out).

The visible checks use small numbers; this case uses block sizes where float arithmetic
loses the last unit (past 2**53), which the contract allows (02.1 accepts any positive int):
a batch's running block count done in floats admits a batch that does not fit, and then
the batch is half admitted.
"""

from __future__ import annotations

from typing import Any

from paged_kv_lib.errors import OutOfBlocksError
from paged_kv_course.grading._checks_02_script import STATE, Script, library, library_state
from paged_kv_course.grading._common import passed
from paged_kv_course.grading.hidden import case


@case("02.3", points=1, hint="a batch with a block size past 2**53 was not refused whole: count its blocks "
                             "in integers (// and %)")
def batch_past_float_precision(MyAllocator: Any) -> None:
    block_size = 2**53 + 1
    a, ref = Script(MyAllocator, 3, block_size), library(3, block_size)
    requests = [(0, 2 * block_size + 1), (1, block_size)]  # 3 + 1 blocks, in a pool of 3
    before = library_state(ref)
    a.refused("allocate_batch", (requests,), (OutOfBlocksError, RuntimeError),
              accepted="the batch needs 4 blocks and the pool has 3")
    a.state({name: before[name] for name in STATE if name in before},
            "a refused batch changes nothing ({name} changed)")
    passed("02.3")
