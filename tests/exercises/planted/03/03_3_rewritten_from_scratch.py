# expect: a rewrite, not a repair
def repaired_allocator():
    """A correct allocator of the same design, written anew: it never looks at ShakyAllocator."""

    class Fresh:
        def __init__(self, num_blocks, block_size):
            if num_blocks < 1 or block_size < 1:
                raise ValueError(f"bad pool {num_blocks} x {block_size}")
            self.block_size = block_size
            self.spare = [num_blocks - 1 - k for k in range(num_blocks)]
            self.refs, self.tables, self.lengths = {}, {}, {}

        @property
        def num_free_blocks(self):
            return len(self.spare)

        def allocate_for_sequence(self, seq_id, num_prompt_tokens):
            if seq_id in self.lengths or num_prompt_tokens < 0:
                raise ValueError(f"cannot allocate {seq_id} with {num_prompt_tokens} tokens")
            need = (num_prompt_tokens + self.block_size - 1) // self.block_size
            have = len(self.spare)
            if need > have:
                raise errors.OutOfBlocksError(need, have, f"allocate sequence {seq_id}")
            got = self.spare[len(self.spare) - need:][::-1]
            del self.spare[len(self.spare) - need:]
            self.refs.update({b: 1 for b in got})
            self.tables[seq_id], self.lengths[seq_id] = got, num_prompt_tokens

        def get_block_mapping(self, seq_id):
            try:
                return self.tables[seq_id][:]
            except KeyError:
                raise ValueError(f"no sequence {seq_id}") from None

        def fork(self, parent_seq_id, child_seq_id):
            if parent_seq_id not in self.tables or child_seq_id in self.tables:
                raise ValueError(f"cannot fork {parent_seq_id} into {child_seq_id}")
            self.tables[child_seq_id] = self.tables[parent_seq_id][:]
            self.lengths[child_seq_id] = self.lengths[parent_seq_id]
            for b in self.tables[child_seq_id]:
                self.refs[b] = self.refs[b] + 1

        def free_sequence(self, seq_id):
            if seq_id not in self.tables:
                return
            self.lengths.pop(seq_id)
            for b in self.tables.pop(seq_id)[::-1]:
                self.refs[b] = self.refs[b] - 1
                if self.refs[b] == 0:
                    self.refs.pop(b)
                    self.spare += [b]

    return Fresh
