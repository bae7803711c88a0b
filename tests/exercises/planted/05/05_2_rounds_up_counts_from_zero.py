# expect: count each sequence's new blocks from its own length
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MyAllocator(MyAllocator):
    """Your allocator of task 05.1, plus the scheduler's question."""

    def can_append(self, seq_ids, num_tokens=1, *, watermark=0.0):
        """Whether every listed sequence can grow by `num_tokens` at once and leave the watermark free."""
        if not 0.0 <= watermark <= 1.0:
            raise ValueError(f"watermark {watermark!r} is outside 0..1")
        asked = list(seq_ids)
        if len(set(asked)) < len(asked):
            raise ValueError(f"{asked} lists a sequence more than once")
        wanted = 0
        for seq_id in asked:
            if seq_id not in self.tables:
                raise ValueError(f"sequence {seq_id} is not allocated")
            held, length = len(self.tables[seq_id]), self.lengths[seq_id]
            wanted += math.ceil(num_tokens / self.block_size)
        return len(self.free) - wanted >= math.ceil(watermark * self.num_blocks)
