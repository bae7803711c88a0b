# expect: paged_kv_course.seed
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
from paged_kv_course.seed import SeedAllocator


class MyAllocator(SeedAllocator):
    """The seed's allocator under the contract's names."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free = self.free_blocks
        self.ref_counts = [0] * num_blocks
        self.tables = {}
        self.lengths = {}
