# expect: must fail before it changes anything
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MyAllocator(AllocatorAfter03):
    """Your allocator: exercise 03's bookkeeping, plus growth on demand."""

    def append_tokens(self, seq_id, num_tokens=1):
        """Grow `seq_id` by `num_tokens` tokens; return the ids of the blocks it took, in order."""
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        table = self.tables[seq_id]
        new_blocks = []
        for _ in range(num_tokens):
            current_length = self.lengths[seq_id]
            if current_length % self.block_size == 0:
                if not self.free:
                    raise RuntimeError(f"no free block to grow sequence {seq_id}")
                (block_id,) = self.take_blocks(1)
                table.append(block_id)
                new_blocks.append(block_id)
            self.lengths[seq_id] = current_length + 1
        return new_blocks
