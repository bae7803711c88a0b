# expect: you preempted the oldest request
def choose_victims(running, free_blocks):
    """Preempts the oldest running request instead of the newest."""
    queue = list(running)
    out, set_aside, k = [], 0, 0
    while k < len(queue):
        if queue[k][2] <= free_blocks - set_aside:
            set_aside += queue[k][2]
            k += 1
            continue
        rid, held, need = queue.pop(0)
        out.append(rid)
        free_blocks += held
        if k > 0:  # it had been served this step: its blocks are set aside no longer
            set_aside -= need
            k -= 1
    return out
