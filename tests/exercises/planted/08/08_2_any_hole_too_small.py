# expect: only when every hole is too small
def memory_parts(capacity, running, free_holes, first_waiting):
    """Counts the free slots as external as soon as any one hole is smaller than the waiting request."""
    tokens = sum(held for held, _, _ in running)
    will_fill = [min(slots, final_len) for _, final_len, slots in running]
    held = sum(slots for _, _, slots in running)
    free = sum(free_holes)
    blocked = first_waiting is not None and any(h < first_waiting for h in free_holes) and first_waiting <= free
    external = free if blocked else 0
    return {"token_states": tokens, "reserved": sum(will_fill) - tokens,
            "internal": held - sum(will_fill) + capacity - held - free, "external": external,
            "free": free - external}
