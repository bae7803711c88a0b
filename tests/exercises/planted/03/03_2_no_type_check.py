# expect: 9.0, a float, in place of block 9
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def check_invariants(self):
        """Raise AssertionError unless the free queue, reference counts, tables and lengths agree."""
        size = len(self.ref_counts)

        def is_block(block):
            return 0 <= block < size

        waiting = list(self.free)
        assert all(map(is_block, waiting)), f"the free queue holds an id that is no block: {waiting}"
        assert len(set(waiting)) == len(waiting), f"the free queue repeats a block: {waiting}"
        assert set(self.tables) == set(self.lengths), "tables and lengths name different sequences"
        holders = [0] * size
        for seq_id, blocks in self.tables.items():
            assert all(map(is_block, blocks)), f"sequence {seq_id} lists an id that is no block: {blocks}"
            assert len(set(blocks)) == len(blocks), f"sequence {seq_id} lists a block twice: {blocks}"
            tokens = self.lengths[seq_id]
            fewest = -(-tokens // self.block_size)
            assert fewest <= len(blocks) <= tokens // self.block_size + 1, (
                f"sequence {seq_id} holds {tokens} tokens in {len(blocks)} blocks")
            for block in blocks:
                holders[block] += 1
        queued = set(waiting)
        for block, count in enumerate(self.ref_counts):
            assert count == holders[block], f"block {block} counts {count} holders, {holders[block]} tables hold it"
            assert (count == 0) == (block in queued), f"block {block}: {count} holders, in the free queue: {block in queued}"
