# expect: spare again, but in another order
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
def repaired_allocator():
    """Return ShakyAllocator's design with its three bugs fixed (a class)."""
    class RepairedAllocator(ShakyAllocator):
        def allocate_for_sequence(self, seq_id, num_prompt_tokens):
            if seq_id in self.tables:
                raise ValueError(f"sequence {seq_id} exists already")
            if num_prompt_tokens < 0:
                raise ValueError(f"a prompt of {num_prompt_tokens} tokens")
            count = -(-num_prompt_tokens // self.block_size)
            if count > len(self.spare):
                raise errors.OutOfBlocksError(count, len(self.spare), f"allocate sequence {seq_id}")
            self.lengths[seq_id] = num_prompt_tokens  # fixed: registered only once it fits
            table = [self.spare.pop() for _ in range(count)]
            for block in table:
                self.refs[block] = 1
            self.tables[seq_id] = table

        def fork(self, parent_seq_id, child_seq_id):
            if child_seq_id in self.tables:  # fixed: a live child would lose its blocks
                raise ValueError(f"sequence {child_seq_id} exists already")
            super().fork(parent_seq_id, child_seq_id)

        def free_sequence(self, seq_id):
            table = self.tables.pop(seq_id, None)
            if table is None:
                return
            del self.lengths[seq_id]
            for block in table:
                self.refs[block] -= 1
                if self.refs[block] == 0:  # fixed: free only when the last holder lets go
                    del self.refs[block]
                    self.spare.append(block)

    return RepairedAllocator
