# expect: a rewrite, not a repair
class MyAllocator(AllocatorAfter03):
    """Growth written from the contract alone: it never looks at SeedStyleGrowth."""

    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        length = self.lengths[seq_id]
        have = len(self.tables[seq_id]) * self.block_size
        need = max(0, -(-(length + num_tokens - have) // self.block_size))
        if need > len(self.free):
            raise RuntimeError(f"sequence {seq_id} needs {need} more blocks")
        taken = self.take_blocks(need)
        self.tables[seq_id] += taken
        self.lengths[seq_id] = length + num_tokens
        return taken
