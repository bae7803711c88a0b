# expect: uses paged_kv_lib.allocator
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_lib.allocator import PagedKVCacheAllocator


class MyAllocator:
    """A thin wrapper: the library's allocator does the work."""

    def __init__(self, num_blocks, block_size):
        self.inner = PagedKVCacheAllocator(num_blocks, block_size, 1, 1, allocate_cache=False,
                                           enable_prefix_caching=False)
        self.num_blocks, self.block_size = num_blocks, block_size

    @property
    def num_free_blocks(self):
        return self.inner.num_free_blocks

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        self.inner.allocate_for_sequence(seq_id, num_prompt_tokens)

    def append_tokens(self, seq_id, num_tokens=1):
        return list(self.inner.append_tokens(seq_id, num_tokens))

    def free_sequence(self, seq_id):
        self.inner.free_sequence(seq_id)

    def get_block_mapping(self, seq_id):
        return self.inner.get_block_mapping(seq_id)

    def fork(self, parent_seq_id, child_seq_id):
        self.inner.fork(parent_seq_id, child_seq_id)
