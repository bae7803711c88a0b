# expect: more than all free slots together
def memory_parts(capacity, running, free_holes, first_waiting):
    """Calls every refusal external, even one that no arrangement of the holes would help."""
    tokens = sum(held for held, _, _ in running)
    will_fill = [min(slots, final_len) for _, final_len, slots in running]
    held_slots = sum(slots for _, _, slots in running)
    free = sum(free_holes)
    internal = held_slots - sum(will_fill) + capacity - held_slots - free
    blocked = first_waiting is not None and max(free_holes, default=0) < first_waiting
    external = free if blocked else 0
    return {"token_states": tokens, "reserved": sum(will_fill) - tokens, "internal": internal,
            "external": external, "free": free - external}
