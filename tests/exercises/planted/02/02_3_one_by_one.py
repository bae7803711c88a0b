# expect: the refused batch left sequence(s) [4, 5] admitted
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        for seq_id, tokens in requests:
            self.allocate_for_sequence(seq_id, tokens)
