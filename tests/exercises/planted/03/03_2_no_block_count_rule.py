# expect: they do not fit
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def check_invariants(self):
        """Raise AssertionError unless the free queue, reference counts, tables and lengths agree."""
        size = len(self.ref_counts)

        def is_block(block):
            return type(block) is int and 0 <= block < size

        waiting = list(self.free)
        assert all(map(is_block, waiting)), f"the free queue holds an id that is no block: {waiting}"
        assert len(set(waiting)) == len(waiting), f"the free queue repeats a block: {waiting}"
        assert set(self.tables) == set(self.lengths), "tables and lengths name different sequences"
        holders = Counter()
        for seq_id, blocks in self.tables.items():
            assert all(map(is_block, blocks)), f"sequence {seq_id} lists an id that is no block: {blocks}"
            assert len(set(blocks)) == len(blocks), f"sequence {seq_id} lists a block twice: {blocks}"
            holders.update(blocks)
        queued = set(waiting)
        for block, count in enumerate(self.ref_counts):
            assert count == holders[block], f"block {block} counts {count} holders, {holders[block]} tables hold it"
            assert (count == 0) == (block in queued), f"block {block}: {count} holders, in the free queue: {block in queued}"
