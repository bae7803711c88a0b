# expect: 'window' and 'window_steps' say which steps
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
class MemoryMeter:
    """The time-averaged memory breakdown of one run, fed the step snapshots a chunk at a time."""

    PARTS = ("token_states", "reserved", "internal", "external", "free")

    def __init__(self, capacity):
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity must be an int of at least 1 slot, got {capacity!r}")
        self.capacity = capacity
        self.last_step = None
        self.sums = {"busy": dict.fromkeys(self.PARTS + ("running", "steps"), 0)}
        self.sums["loaded"] = dict(self.sums["busy"])

    def add(self, snapshots):
        last = self.last_step
        for snap in snapshots:  # the whole chunk is checked before any of it counts
            parts = [getattr(snap, part) for part in self.PARTS]
            if min(parts) < 0 or snap.running < 0 or snap.waiting < 0:
                raise ValueError(f"step {snap.step} has a negative part or count")
            if sum(parts) != self.capacity:
                raise ValueError(f"step {snap.step}: its parts add up to {sum(parts)}, the capacity is {self.capacity}")
            if last is not None and snap.step <= last:
                raise ValueError(f"step {snap.step} does not come after step {last}")
            last = snap.step
        for snap in snapshots:
            windows = ("busy", "loaded") if snap.waiting > 0 else ("busy",)
            for window in windows:
                totals = self.sums[window]
                for part in self.PARTS + ("running",):
                    totals[part] += getattr(snap, part)
                totals["steps"] += 1
        self.last_step = last

    def summary(self):
        window = "loaded" if self.sums["loaded"]["steps"] else "busy"
        totals = self.sums[window]
        steps = totals["steps"]
        if not steps:
            raise ValueError("no step has been added yet: there is nothing to describe")
        out = {part: totals[part] / (steps * self.capacity) for part in self.PARTS}
        out.update(mean_batch=totals["running"] / steps, window="loaded", window_steps=self.sums["busy"]["steps"])
        return out
