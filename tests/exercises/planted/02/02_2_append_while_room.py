# expect: a second reserved block would sit unused
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def append_block_to_sequence(self, seq_id):
        mine = self.tables.get(seq_id)
        if mine is None:
            raise ValueError(f"sequence {seq_id} is not live")
        if not self.free:
            raise errors.OutOfBlocksError(1, 0, f"grow sequence {seq_id}")
        block = self.free.popleft()
        self.ref_counts[block] += 1
        mine.append(block)
        return block

    def free_sequence(self, seq_id):
        if seq_id not in self.tables:
            return
        released = self.tables.pop(seq_id)
        self.lengths.pop(seq_id)
        while released:
            block = released.pop()
            self.ref_counts[block] = 0
            self.free.append(block)
