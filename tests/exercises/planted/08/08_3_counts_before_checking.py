# expect: not even its good snapshots
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MemoryMeter:
    """Checks each snapshot just before counting it: a bad one late in a chunk comes too late."""

    PARTS = ("token_states", "reserved", "internal", "external", "free")

    def __init__(self, capacity):
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity must be an int of at least 1 slot, got {capacity!r}")
        self.capacity = capacity
        self.last_step = None
        self.sums = {"busy": dict.fromkeys(self.PARTS + ("running", "steps"), 0)}
        self.sums["loaded"] = dict(self.sums["busy"])

    def add(self, snapshots):
        for snap in snapshots:
            parts = [getattr(snap, part) for part in self.PARTS]
            if min(parts) < 0 or snap.running < 0 or snap.waiting < 0:
                raise ValueError(f"step {snap.step} has a negative part or count")
            if sum(parts) != self.capacity:
                raise ValueError(f"step {snap.step}: its parts add up to {sum(parts)}")
            if self.last_step is not None and snap.step <= self.last_step:
                raise ValueError(f"step {snap.step} does not come after step {self.last_step}")
            self.last_step = snap.step
            for window in ("busy", "loaded") if snap.waiting > 0 else ("busy",):
                totals = self.sums[window]
                for part in self.PARTS + ("running",):
                    totals[part] += getattr(snap, part)
                totals["steps"] += 1

    def summary(self):
        window = "loaded" if self.sums["loaded"]["steps"] else "busy"
        totals = self.sums[window]
        steps = totals["steps"]
        if not steps:
            raise ValueError("no step has been added yet")
        out = {part: totals[part] / (steps * self.capacity) for part in self.PARTS}
        out.update(mean_batch=totals["running"] / steps, window=window, window_steps=steps)
        return out
