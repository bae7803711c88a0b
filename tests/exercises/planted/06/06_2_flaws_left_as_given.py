# expect: the first part that differs: the root (property 2)
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def salted_block_key(parent_key, token_ids, extra_key=None):
    """The provided version, handed in unchanged."""
    return salted_block_key_with_flaws(parent_key, token_ids, extra_key)
