# expect: a hit rate of at least
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def eviction_order(candidates):
    """The first rule about use counts: blocks used once go first, then least recently used."""
    return [c["block"] for c in sorted(candidates, key=lambda c: (c["uses"] > 1, c["last_used"]))]
