# expect: neither held nor free
def memory_parts(capacity, running, free_holes, first_waiting):
    """Leaves the slots past a paged pool's last whole block out of every part."""
    tokens = sum(held for held, _, _ in running)
    will_fill = [min(slots, final_len) for _, final_len, slots in running]
    reserved = sum(will_fill) - tokens
    internal = sum(slots for _, _, slots in running) - sum(will_fill)
    free = sum(free_holes)
    blocked = first_waiting is not None and max(free_holes, default=0) < first_waiting <= free
    external = free if blocked else 0
    return {"token_states": tokens, "reserved": reserved, "internal": internal, "external": external,
            "free": free - external}
