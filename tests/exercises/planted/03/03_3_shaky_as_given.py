# expect: differs from the library's allocator
# ruff: noqa: F821 (a notebook cell: names come from the cells before it)
def repaired_allocator():
    """No repair at all."""
    return ShakyAllocator
