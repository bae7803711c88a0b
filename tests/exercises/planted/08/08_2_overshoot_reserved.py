# expect: internal, not reserved
def memory_parts(capacity, running, free_holes, first_waiting):
    """Counts a last block's slots past the final length as reserved."""
    tokens = sum(held for held, _, _ in running)
    held_slots = sum(slots for _, _, slots in running)
    free = sum(free_holes)
    reserved = held_slots - tokens
    internal = capacity - held_slots - free
    blocked = first_waiting is not None and max(free_holes, default=0) < first_waiting <= free
    external = free if blocked else 0
    return {"token_states": tokens, "reserved": reserved, "internal": internal, "external": external,
            "free": free - external}
