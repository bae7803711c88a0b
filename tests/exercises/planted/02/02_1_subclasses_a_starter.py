# expect: paged_kv_course.starters
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
from paged_kv_course.starters.after_02 import AllocatorAfter02

class MyAllocator(AllocatorAfter02):
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a pool needs blocks of at least one slot")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables = {}
        self.lengths = {}

    @property
    def num_free_blocks(self):
        return len(self.free)

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if type(num_prompt_tokens) is not int:
            raise TypeError("the token count must be an int")
        if num_prompt_tokens < 0:
            raise ValueError("negative token count")
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} exists")
        needed = (num_prompt_tokens + self.block_size - 1) // self.block_size
        if needed > len(self.free):
            raise RuntimeError(f"need {needed} blocks, {len(self.free)} free")
        table = [self.free.popleft() for _ in range(needed)]
        for block in table:
            self.ref_counts[block] = 1
        self.tables[seq_id] = table
        self.lengths[seq_id] = num_prompt_tokens

    def get_block_mapping(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not live")
        return list(self.tables[seq_id])
