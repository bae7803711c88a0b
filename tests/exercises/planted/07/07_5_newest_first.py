# expect: this is newest-first itself
def choose_victim(running, asking):
    """The engine's own rule: no cheaper than the engine."""
    return running[-1][0]
