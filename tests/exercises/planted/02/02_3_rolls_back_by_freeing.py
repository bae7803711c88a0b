# expect: giving blocks back is not undoing
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def allocate_batch(self, requests):
        admitted = []
        try:
            for seq_id, tokens in requests:
                self.allocate_for_sequence(seq_id, tokens)
                admitted.append(seq_id)
        except Exception:
            for seq_id in admitted:
                self.free_sequence(seq_id)
            raise
