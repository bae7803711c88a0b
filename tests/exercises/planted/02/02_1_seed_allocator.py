# expect: paged_kv_lib.seed
from paged_kv_lib.seed import SeedAllocator


class MyAllocator(SeedAllocator):
    """The seed's allocator under the contract's names."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free = self.free_blocks
        self.ref_counts = [0] * num_blocks
        self.tables = {}
        self.lengths = {}
