# expect: so the batch is refused
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        needed, claimed = 0, set()
        for seq_id, tokens in requests:
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                return
            if seq_id in self.tables or seq_id in claimed:
                return
            claimed.add(seq_id)
            needed += -(-tokens // self.block_size)
        if needed > len(self.free):
            return
        for seq_id, tokens in requests:
            self.allocate_for_sequence(seq_id, tokens)
