# expect: fork took blocks from the free queue
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
from paged_kv_course.starters.after_02 import AllocatorAfter02 as MyAllocator


class MyAllocator(MyAllocator):
    def fork(self, parent_seq_id, child_seq_id):
        """Make ``child_seq_id`` a new sequence sharing every block of ``parent_seq_id``."""
        if parent_seq_id not in self.tables:
            raise ValueError(f"sequence {parent_seq_id} is not live: nothing to fork")
        if child_seq_id in self.tables:
            raise ValueError(f"sequence {child_seq_id} is live already")
        self.tables[child_seq_id] = self.take_blocks(len(self.tables[parent_seq_id]))
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]

    def free_sequence(self, seq_id):
        """End a sequence; each of its blocks loses a holder, and a block nobody holds is free again."""
        if seq_id not in self.tables:
            return
        released = self.tables.pop(seq_id)
        del self.lengths[seq_id]
        while released:
            block = released.pop()
            self.ref_counts[block] -= 1
            if not self.ref_counts[block]:
                self.free.append(block)
