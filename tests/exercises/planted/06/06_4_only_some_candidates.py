# expect: each once
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def eviction_order(candidates):
    """Cached free blocks in the order to evict them, first to go first."""
    # Blocks used once are likely one-off content: they go first, oldest first. Among those reused, the least
    # recently used goes first, and within a prompt its tail before its head (a tail is useless without its head).
    def keep_score(c):
        return (c["uses"] > 1, c["last_used"], -c["position"])

    return [c["block"] for c in sorted(candidates, key=keep_score)][:8]
