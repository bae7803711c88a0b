# expect: each request fits alone, but together they need
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        for seq_id, tokens in requests:
            if isinstance(tokens, bool) or not isinstance(tokens, int):
                raise TypeError(f"the token count must be an int, got {tokens!r}")
            if tokens < 0:
                raise ValueError(f"the token count must be >= 0, got {tokens}")
            if seq_id in self.tables:
                raise ValueError(f"sequence {seq_id} is live already")
            if -(-tokens // self.block_size) > len(self.free):
                raise errors.OutOfBlocksError(-(-tokens // self.block_size), len(self.free), "admit a batch")
        admitted = []
        for seq_id, tokens in requests:
            if -(-tokens // self.block_size) > len(self.free):
                for done in admitted:
                    self.free_sequence(done)
                return
            self.allocate_for_sequence(seq_id, tokens)
            admitted.append(seq_id)
