# expect: the copy came from the tail of the free queue
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_course.starters.after_05 import AllocatorAfter05  # or your own class from exercise 05


class MyAllocator(AllocatorAfter05):
    """Your allocator: exercise 05's, plus copy-on-write of a shared last block."""

    def append_tokens(self, seq_id, num_tokens=1):
        """Grow `seq_id` by `num_tokens`; a shared last block that gets written is copied first."""
        if seq_id not in self.tables:
            raise ValueError(f"sequence {seq_id} is not allocated")
        table, length = self.tables[seq_id], self.lengths[seq_id]
        writes_into_tail = num_tokens > 0 and length % self.block_size != 0
        must_copy = writes_into_tail and self.ref_counts[table[-1]] > 1
        growth = max(0, math.ceil((length + num_tokens) / self.block_size) - len(table))
        if must_copy + growth > len(self.free):
            raise RuntimeError(f"sequence {seq_id} needs {must_copy + growth} blocks, {len(self.free)} are free")
        placed = []
        if must_copy:
            private = self.free.pop()  # the copy
            self.ref_counts[private] = 1
            self.ref_counts[table[-1]] -= 1
            table[-1] = private
            placed.append(private)
        return placed + super().append_tokens(seq_id, num_tokens)
