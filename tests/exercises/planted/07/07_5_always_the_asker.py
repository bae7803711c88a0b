# expect: at most 90% of newest-first's
def choose_victim(running, asking):
    """Preempts whoever asks: it does not pay for itself."""
    return asking
