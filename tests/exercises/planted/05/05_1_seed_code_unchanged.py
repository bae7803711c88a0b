# expect: off by one at a block boundary
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MyAllocator(AllocatorAfter03):
    """Your allocator: exercise 03's bookkeeping, plus growth on demand."""

    append_tokens = SeedStyleGrowth.append_tokens
