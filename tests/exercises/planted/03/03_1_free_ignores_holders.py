# expect: a block is free only when no table holds it
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
from paged_kv_course.starters.after_02 import AllocatorAfter02 as MyAllocator


class MyAllocator(MyAllocator):
    def fork(self, parent_seq_id, child_seq_id):
        """Make ``child_seq_id`` a new sequence sharing every block of ``parent_seq_id``."""
        if parent_seq_id not in self.tables:
            raise ValueError(f"sequence {parent_seq_id} is not live: nothing to fork")
        if child_seq_id in self.tables:
            raise ValueError(f"sequence {child_seq_id} is live already")
        shared = self.tables[parent_seq_id]
        self.tables[child_seq_id] = shared.copy()
        self.lengths[child_seq_id] = self.lengths[parent_seq_id]
        for block in shared:
            self.ref_counts[block] += 1

    def free_sequence(self, seq_id):
        """End a sequence; each of its blocks loses a holder, and a block nobody holds is free again."""
        if seq_id not in self.tables:
            return
        released = self.tables.pop(seq_id)
        del self.lengths[seq_id]
        while released:
            block = released.pop()
            self.ref_counts[block] = 0
            if block not in self.free:
                self.free.append(block)
