# expect: average only the loaded steps
def time_averaged(snapshots, capacity):
    """Averages every step, loaded or not."""
    if not snapshots:
        raise ValueError("no snapshots")
    parts = ("token_states", "reserved", "internal", "external", "free")
    out = {p: sum(getattr(s, p) for s in snapshots) / (len(snapshots) * capacity) for p in parts}
    out["mean_batch"] = sum(s.running for s in snapshots) / len(snapshots)
    return out
