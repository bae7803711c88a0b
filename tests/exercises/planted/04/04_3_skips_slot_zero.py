# expect: slot 0 is a real slot
def my_write_kv(k_cache, v_cache, slot_mapping, k, v):
    """Writes the tokens whose slot is real; padding (-1) stores nothing."""
    size = k_cache.shape[2]
    keep = slot_mapping > 0
    slots = slot_mapping[keep]
    k_cache[slots // size, :, slots % size, :] = k[keep]
    v_cache[slots // size, :, slots % size, :] = v[keep]
