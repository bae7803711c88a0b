# expect: allocate_batch only reads its argument
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        claimed, needed = set(), 0
        for seq_id, tokens in requests:
            if isinstance(tokens, bool) or not isinstance(tokens, int):
                raise TypeError(f"the token count must be an int, got {tokens!r}")
            if tokens < 0:
                raise ValueError(f"the token count must be >= 0, got {tokens}")
            if seq_id in self.tables or seq_id in claimed:
                raise ValueError(f"sequence {seq_id} is taken")
            claimed.add(seq_id)
            needed += -(-tokens // self.block_size)
            if needed > len(self.free):
                raise errors.OutOfBlocksError(needed, len(self.free), "admit a batch")
        while requests:
            self.allocate_for_sequence(*requests.pop(0))
