# expect: your checker missed it
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
class MyAllocator(MyAllocator):
    def check_invariants(self):
        used = sum(1 for count in self.ref_counts if count > 0)
        assert len(self.free) + used == len(self.ref_counts), "free + used != total"
