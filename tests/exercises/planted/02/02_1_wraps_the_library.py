# expect: paged_kv_lib.allocator
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
from paged_kv_lib.allocator import PagedKVCacheAllocator


class MyAllocator:
    """A thin wrapper: the library does the work."""

    def __init__(self, num_blocks, block_size):
        self.inner = PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False,
                                           enable_prefix_caching=False)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def num_free_blocks(self):
        return self.inner.num_free_blocks

    @property
    def free(self):
        return deque(self.inner.free_blocks)

    @property
    def ref_counts(self):
        return [b.ref_count for b in self.inner.blocks]

    @property
    def tables(self):
        return {s: self.inner.get_block_mapping(s) for s in self.inner.seq_ids}

    @property
    def lengths(self):
        return {s: self.inner.get_num_tokens(s) for s in self.inner.seq_ids}

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        self.inner.allocate_for_sequence(seq_id, num_prompt_tokens)

    def get_block_mapping(self, seq_id):
        return self.inner.get_block_mapping(seq_id)
