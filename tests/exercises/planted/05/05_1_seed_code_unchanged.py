# expect: off by one at a block boundary
class MyAllocator(AllocatorAfter03):
    """Your allocator: exercise 03's bookkeeping, plus growth on demand."""

    append_tokens = SeedStyleGrowth.append_tokens
