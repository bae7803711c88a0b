# expect: -1 counts from the end
def my_write_kv(k_cache, v_cache, slot_mapping, k, v):
    """Writes every token, padding included."""
    size = k_cache.shape[2]
    k_cache[slot_mapping // size, :, slot_mapping % size, :] = k
    v_cache[slot_mapping // size, :, slot_mapping % size, :] = v
