# expect: which is not the id of a running request
def choose_victim(running, asking):
    """Returns a position in the list instead of a request id."""
    return min(range(len(running)), key=lambda i: running[i][1])
