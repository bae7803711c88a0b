# expect: take_blocks(count) pops count ids off the head of the free queue
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator:
    """Your allocator's books: a free queue, reference counts, block tables and lengths."""

    def __init__(self, num_blocks, block_size):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
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
        if isinstance(num_prompt_tokens, bool) or not isinstance(num_prompt_tokens, int):
            raise TypeError(f"the token count must be an int, got {num_prompt_tokens!r}")
        if num_prompt_tokens < 0:
            raise ValueError(f"the token count must be >= 0, got {num_prompt_tokens}")
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} is live already")
        full, rest = divmod(num_prompt_tokens, self.block_size)
        count = full + (rest > 0)
        if count > len(self.free):
            raise errors.OutOfBlocksError(count, len(self.free), f"allocate sequence {seq_id}")
        self.tables[seq_id] = [self.free.popleft() for _ in range(count)]
        for block in self.tables[seq_id]:
            self.ref_counts[block] += 1
        self.lengths[seq_id] = num_prompt_tokens

    def get_block_mapping(self, seq_id):
        try:
            return list(self.tables[seq_id])
        except KeyError:
            raise ValueError(f"sequence {seq_id} is not live") from None

    def take_blocks(self, count):
        """Pop ``count`` ids off the head of the free queue, each now held once: the one way blocks leave it."""
        if count < 0:
            raise ValueError(f"cannot take {count} blocks")
        if count > len(self.free):
            raise errors.OutOfBlocksError(count, len(self.free), f"take {count} blocks")
        taken = [self.free.pop() for _ in range(count)]
        for block in taken:
            self.ref_counts[block] += 1
        return taken
