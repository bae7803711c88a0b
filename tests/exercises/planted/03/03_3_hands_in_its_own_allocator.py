# expect: keep ShakyAllocator's design
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
def repaired_allocator():
    """The learner's own allocator from task 03.1, in place of the repair."""
    return MyAllocator
