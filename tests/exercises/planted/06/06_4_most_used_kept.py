# expect: a hit rate of at least
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def eviction_order(candidates):
    """Least frequently used first (LFU), ties least recently used."""
    return [c["block"] for c in sorted(candidates, key=lambda c: (c["uses"], c["last_used"]))]
