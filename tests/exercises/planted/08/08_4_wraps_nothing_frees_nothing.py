# expect: given back
class MyAllocator:
    """Never returns a freed sequence's blocks to the free list."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free = list(range(num_blocks - 1, -1, -1))
        self.tables = {}
        self.lengths = {}

    @property
    def num_free_blocks(self):
        return len(self.free)

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} exists")
        need = -(-num_prompt_tokens // self.block_size)
        if need > len(self.free):
            raise RuntimeError(f"need {need} blocks, {len(self.free)} free")
        self.tables[seq_id] = [self.free.pop() for _ in range(need)]
        self.lengths[seq_id] = num_prompt_tokens

    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        table = self.tables[seq_id]
        need = -(-(self.lengths[seq_id] + num_tokens) // self.block_size) - len(table)
        if need > len(self.free):
            raise RuntimeError(f"need {need} blocks, {len(self.free)} free")
        fresh = [self.free.pop() for _ in range(need)]
        table.extend(fresh)
        self.lengths[seq_id] += num_tokens
        return fresh

    def free_sequence(self, seq_id):
        self.tables.pop(seq_id, None)
        self.lengths.pop(seq_id, None)

    def get_block_mapping(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError(f"unknown sequence {seq_id}")
        return list(self.tables[seq_id])

    def fork(self, parent_seq_id, child_seq_id):
        raise NotImplementedError("not needed by the simulation")
