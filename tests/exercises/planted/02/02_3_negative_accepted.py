# expect: is negative and was accepted
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def block_of(self, seq_id, position):
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not live")
        held = self.lengths[seq_id]
        if position >= held:
            raise ValueError(f"position {position} holds no token: sequence {seq_id} holds {held}")
        index = position // self.block_size
        return self.tables[seq_id][index]
