# expect: uses paged_kv_lib.simulate.metrics
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from paged_kv_lib.simulate.metrics import Averager


class MemoryMeter:
    """The simulator's own averaging, wrapped."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity")
        self.capacity, self.inner, self.steps = capacity, Averager(), 0

    def add(self, snapshots):
        for s in snapshots:
            self.inner.add(s.token_states, s.reserved, s.internal, s.external, s.free, s.running, s.waiting > 0)
            self.steps += 1

    def summary(self):
        if not self.steps:
            raise ValueError("nothing yet")
        r = self.inner.result("mine", None, self.capacity, 0, 0, self.steps)
        return {"token_states": r.token_states, "reserved": r.reserved, "internal": r.internal,
                "external": r.external, "free": r.free, "mean_batch": r.mean_batch, "window": r.window,
                "window_steps": r.window_steps}
