# expect: uses paged_kv_lib.prefix_cache
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_lib.prefix_cache import block_key


def salted_block_key(parent_key, token_ids, extra_key=None):
    """The library's key (which the task says not to call)."""
    return block_key(parent_key, token_ids, extra_key)
