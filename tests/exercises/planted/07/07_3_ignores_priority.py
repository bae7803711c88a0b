# expect: whatever its priority
def choose_victims_by_priority(running, free_blocks):
    """The engine's newest-first rule, priorities ignored."""
    alive = list(running)
    order, taken, at = [], 0, 0
    while at < len(alive):
        need = alive[at][3]
        if need <= free_blocks - taken:
            taken += need
            at += 1
            continue
        victim = alive.pop()
        order.append(victim[0])
        free_blocks += victim[2]
    return order
