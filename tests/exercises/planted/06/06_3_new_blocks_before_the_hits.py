# expect: before taking its hits out of the free queue
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MyAllocator(MyAllocator):
    """Your allocator of task 06.1, plus a prefix cache: full prompt blocks found again by content."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.block_of_key = {}  # content key -> the block holding that content
        self.key_of_block = {}  # the other way round, for the blocks that have one

    def take_blocks(self, count):
        """Blocks off the head of the free queue, each with one holder; what they held is forgotten."""
        taken = super().take_blocks(count)
        for block_id in taken:
            key = self.key_of_block.pop(block_id, None)
            if key is not None:
                del self.block_of_key[key]
        return taken

    def allocate_for_sequence(self, seq_id, num_prompt_tokens, token_ids=None):
        """Allocate a prompt, reusing its cached leading full blocks; returns the prompt tokens found cached."""
        if token_ids is None:
            super().allocate_for_sequence(seq_id, num_prompt_tokens)
            return 0
        if len(token_ids) != num_prompt_tokens:
            raise ValueError(f"{len(token_ids)} token ids for a prompt of {num_prompt_tokens} tokens")
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} is already allocated")
        size = self.block_size
        chain, parent = [], None
        for end in range(size, num_prompt_tokens + 1, size):
            parent = salted_block_key(parent, list(token_ids[end - size:end]))
            chain.append(parent)
        reused = []
        while len(reused) < len(chain) and chain[len(reused)] in self.block_of_key:
            reused.append(self.block_of_key[chain[len(reused)]])
        waiting = [b for b in reused if self.ref_counts[b] == 0]  # cached, but sitting in the free queue
        fresh = math.ceil(num_prompt_tokens / size) - len(reused)
        if fresh + len(waiting) > len(self.free):
            raise RuntimeError(f"sequence {seq_id} needs {fresh + len(waiting)} free blocks, {len(self.free)} are free")
        table = reused + self.take_blocks(fresh)
        for block_id in waiting:
            if block_id in self.free:
                self.free.remove(block_id)
        for block_id in reused:
            self.ref_counts[block_id] += 1
        for key, block_id in zip(chain[len(reused):], table[len(reused):]):
            if key not in self.block_of_key and block_id not in self.key_of_block:
                self.block_of_key[key] = block_id
                self.key_of_block[block_id] = key
        self.tables[seq_id] = table
        self.lengths[seq_id] = num_prompt_tokens
        return len(reused) * size
