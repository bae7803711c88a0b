# expect: the batch raises the error of its first refused request
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        for _, tokens in requests:
            if isinstance(tokens, bool) or not isinstance(tokens, int):
                raise TypeError(f"the token count must be an int, got {tokens!r}")
            if tokens < 0:
                raise ValueError(f"the token count must be >= 0, got {tokens}")
        ids = [seq_id for seq_id, _ in requests]
        if len(set(ids)) < len(ids) or any(seq_id in self.tables for seq_id in ids):
            raise ValueError(f"the batch names a live or repeated id: {ids}")
        needed = sum(-(-tokens // self.block_size) for _, tokens in requests)
        if needed > len(self.free):
            raise errors.OutOfBlocksError(needed, len(self.free), "admit a batch")
        for seq_id, tokens in requests:
            self.allocate_for_sequence(seq_id, tokens)
