# expect: the sequence's length did not grow
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MyAllocator(AllocatorAfter03):
    """Your allocator: exercise 03's bookkeeping, plus growth on demand."""

    def append_tokens(self, seq_id, num_tokens=1):
        """Grow `seq_id` by `num_tokens` tokens; return the ids of the blocks it took, in order."""
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        table, length = self.tables[seq_id], self.lengths[seq_id]
        # A new position opens a block when it is a multiple of block_size (not the one before it).
        opening = sum(1 for pos in range(length, length + num_tokens) if pos % self.block_size == 0)
        if opening > len(self.free):  # decide before changing anything
            raise RuntimeError(f"growing sequence {seq_id} needs {opening} blocks, {len(self.free)} are free")
        new_blocks = self.take_blocks(opening)  # each taken block now has its holder recorded
        table.extend(new_blocks)
        return new_blocks
