# expect: sequence 7 was never allocated, so it cannot grow
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MyAllocator:
    """Block bookkeeping only: a free list, ref counts, one block table and a token count per sequence."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free_ids = list(range(num_blocks - 1, -1, -1))  # the end of the list is taken first
        self.ref_count = [0] * num_blocks
        self.table = {}
        self.length = {}

    @property
    def num_free_blocks(self):
        return len(self.free_ids)

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.table:
            raise ValueError(f"sequence {seq_id} is already allocated")
        count = cdiv(num_prompt_tokens, self.block_size)
        if count > len(self.free_ids):
            raise RuntimeError(f"out of blocks: need {count}, {len(self.free_ids)} free")
        self.table[seq_id] = [self.free_ids.pop() for _ in range(count)]
        for block in self.table[seq_id]:
            self.ref_count[block] = 1
        self.length[seq_id] = num_prompt_tokens

    def append_tokens(self, seq_id, num_tokens=1):
        blocks, old = self.table[seq_id], self.length[seq_id]
        shared_tail = bool(blocks) and old % self.block_size != 0 and self.ref_count[blocks[-1]] > 1
        count = cdiv(old + num_tokens, self.block_size) - len(blocks) + int(shared_tail)
        if count > len(self.free_ids):
            raise RuntimeError(f"out of blocks: need {count}, {len(self.free_ids)} free")
        fresh = [self.free_ids.pop() for _ in range(count)]
        for block in fresh:
            self.ref_count[block] = 1
        if shared_tail:  # copy-on-write: this sequence gets its own copy of the partly filled tail
            self.ref_count[blocks[-1]] -= 1
            blocks[-1] = fresh[0]
            blocks.extend(fresh[1:])
        else:
            blocks.extend(fresh)
        self.length[seq_id] = old + num_tokens
        return fresh

    def free_sequence(self, seq_id):
        for block in reversed(self.table.pop(seq_id, [])):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free_ids.append(block)
        self.length.pop(seq_id, None)

    def get_block_mapping(self, seq_id):
        if seq_id not in self.table:
            raise ValueError(f"unknown sequence {seq_id}")
        return list(self.table[seq_id])

    def fork(self, parent_seq_id, child_seq_id):
        if parent_seq_id not in self.table or child_seq_id in self.table:
            raise ValueError(f"cannot fork {parent_seq_id} into {child_seq_id}")
        self.table[child_seq_id] = list(self.table[parent_seq_id])
        self.length[child_seq_id] = self.length[parent_seq_id]
        for block in self.table[child_seq_id]:
            self.ref_count[block] += 1
