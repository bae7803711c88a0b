"""Check of task 08.3: ``MemoryMeter``, the time-averaged memory breakdown of a run, fed in chunks.

The learner's class gets the snapshots of real simulator runs (and a few made by hand) a chunk
at a time; after every chunk its summary must equal what the simulator's own averaging reports
over the steps so far. Bad chunks (parts that do not add up, negative counts, steps out of
order) must be refused whole, leaving the meter as it was. A wrong summary is compared with a
few known wrong ways of averaging, and the one it matches is named, without the rule.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from paged_kv_lib.block import cdiv
from paged_kv_lib.simulate import PARTS, StepSnapshot, make_memory, make_workload, run_schedule
from paged_kv_lib.simulate.metrics import Averager
from ._common import call_learner, expect_raises, fail, passed

NAME = "MemoryMeter"
KEYS = PARTS + ("mean_batch", "window", "window_steps")
CHUNKS = 6  # chunks per simulated run: every summary is checked after each


def _snap(step: int, parts: Sequence[int], running: int, waiting: int) -> StepSnapshot:
    tokens, reserved, internal, external, free = parts
    return StepSnapshot(step, tokens, reserved, internal, external, free, running, waiting)


def _summary(snaps: Sequence[StepSnapshot], capacity: int, *, window: str = "paper") -> Dict[str, Any]:
    """The simulator's averaging over ``snaps`` (``window="paper"``), or one known wrong way of averaging."""
    averager = Averager()
    for s in snaps:
        loaded = s.waiting > 0 if window != "all" else True
        averager.add(s.token_states, s.reserved, s.internal, s.external, s.free, s.running, loaded)
    result = averager.result(NAME, None, capacity, 0, 0, len(snaps))
    got: Dict[str, Any] = {key: getattr(result, key) for key in PARTS + ("mean_batch", "window", "window_steps")}
    if window == "all":
        got["window"] = "loaded" if any(s.waiting > 0 for s in snaps) else "busy"
    elif window == "slots":
        got.update({key: got[key] * capacity for key in PARTS})
    elif window == "batch_of_all":
        got["mean_batch"] = sum(s.running for s in snaps) / len(snaps)
    return got


_WRONG_WAYS = {
    "all": "the figure averages every step so far, but it describes the steps when memory, not demand, "
           "limits the batch: these snapshots include steps of both kinds",
    "slots": "the parts are fractions of the capacity (0 to 1), not slots",
    "batch_of_all": "the parts cover the right steps, the mean batch does not: both describe the same steps",
}


def _runs() -> Iterator[Tuple[str, List[StepSnapshot], int]]:
    hand = [
        _snap(0, (10, 20, 30, 0, 40), running=1, waiting=0),
        _snap(1, (40, 20, 20, 20, 0), running=4, waiting=3),
        _snap(3, (60, 10, 30, 0, 0), running=6, waiting=1),
        _snap(4, (50, 0, 0, 0, 50), running=5, waiting=0),
    ]
    yield "four hand-made steps (capacity 100), a busy one first", hand, 100
    yield "two hand-made steps, nobody waiting (capacity 100)", [_snap(0, (10, 0, 6, 0, 84), 2, 0),
                                                                  _snap(2, (30, 4, 2, 0, 64), 3, 0)], 100
    for name, n, seed, rate, capacity, kind in (
        ("sharegpt", 40, 0, None, 6000, "paged"),
        ("alpaca", 200, 1, None, 2000, "orca-pow2"),
        ("alpaca", 20, 2, 0.05, 4000, "paged"),  # arrivals too slow to load the cache
    ):
        snaps: List[StepSnapshot] = []
        run_schedule(make_workload(name, n, seed=seed, rate=rate), make_memory(kind, capacity, block_size=16),
                     on_step=snaps.append)
        yield f"the snapshots of a run of {n} {name}-like requests under {kind}, capacity {capacity}", snaps, capacity


def _chunks(snaps: List[StepSnapshot]) -> List[List[StepSnapshot]]:
    if len(snaps) <= 8:
        return [[s] for s in snaps]
    size = cdiv(len(snaps), CHUNKS)
    return [snaps[i:i + size] for i in range(0, len(snaps), size)]


def _compare(call: str, got: Any, snaps: List[StepSnapshot], capacity: int) -> None:
    want = _summary(snaps, capacity)
    if not isinstance(got, dict) or set(got) != set(KEYS):
        raise fail(call, want, got, f"return a dict with exactly the keys {list(KEYS)}")
    for key in KEYS:
        value = got[key]
        if key == "window":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise fail(call, want, got, f"{key!r} must be a finite number, got {value!r}")
    if type(got["window_steps"]) is not int:
        raise fail(call, want, got, "'window_steps' counts steps: an int")
    close = all(math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-12) for k in PARTS + ("mean_batch",))
    if close and got["window"] == want["window"] and got["window_steps"] == want["window_steps"]:
        return
    if close:
        raise fail(call, want, got, "the averages are right; 'window' and 'window_steps' say which steps they "
                   "cover (\"loaded\" or \"busy\") and how many")
    for way, hint in _WRONG_WAYS.items():
        other = _summary(snaps, capacity, window=way)
        if all(math.isclose(got[k], other[k], rel_tol=1e-9, abs_tol=1e-12) for k in PARTS + ("mean_batch",)):
            raise fail(call, want, got, hint)
    raise fail(call, want, got, "after these chunks, which steps does the figure describe, and does the "
               "summary follow when the run's first loaded step arrives?")


def _refused(meter: Any, chunk: List[StepSnapshot], why: str, shown: str, before: Dict[str, Any]) -> None:
    expect_raises(meter.add, (chunk,), f"meter.add({shown})", ValueError, why + ": raise ValueError")
    call = f"meter.summary()  after the refused meter.add({shown})"
    got = call_learner(meter.summary, (), call, before)
    if got != before:
        raise fail(call, before, got, "a refused chunk must change nothing, not even its good snapshots")


def check_memory_meter(cls: Any) -> None:
    """Task 08.3: ``MemoryMeter(capacity)`` with ``add(snapshots)`` and ``summary()``."""
    for capacity in (0, -5):
        expect_raises(cls, (capacity,), f"{NAME}({capacity})", ValueError,
                      f"capacity {capacity}: a cache has at least one slot: raise ValueError")
    for what, snaps, capacity in _runs():
        meter = call_learner(cls, (capacity,), f"{NAME}({capacity})", "a meter")
        expect_raises(meter.summary, (), f"{NAME}({capacity}).summary()  before any step", ValueError,
                      "no step has been added, so there is nothing to describe: raise ValueError")
        call_learner(meter.add, ([],), "meter.add([])", None)
        done: List[StepSnapshot] = []
        summary: Dict[str, Any] = {}
        for k, chunk in enumerate(_chunks(snaps)):
            if k == 1:
                _bad_chunks(meter, done, chunk, capacity, summary)
            call_learner(meter.add, (list(chunk),), f"meter.add(<steps {chunk[0].step}..{chunk[-1].step}>)", None)
            done.extend(chunk)
            call = f"meter.summary()  after steps {done[0].step}..{done[-1].step} of {what}"
            summary = call_learner(meter.summary, (), call, _summary(done, capacity))
            _compare(call, summary, done, capacity)
    passed("08.3")


def _bad_chunks(meter: Any, done: List[StepSnapshot], chunk: List[StepSnapshot], capacity: int,
                before: Dict[str, Any]) -> None:
    """Chunks the meter must refuse whole, each tried before the good ``chunk`` that comes next; ``before``
    is the meter's own summary so far, which a refusal must leave as it was."""
    first, last = chunk[0], chunk[-1]
    short = dataclasses.replace(last, free=last.free - 1)
    negative = dataclasses.replace(last, token_states=-1, free=last.free + last.token_states + 1)
    bad_count = dataclasses.replace(last, waiting=-1)
    cases = [
        (chunk[:-1] + [short], f"step {last.step}'s parts add up to {capacity - 1}, not the capacity {capacity}",
         f"<steps {first.step}..{last.step}, the last one's parts adding up to {capacity - 1}>"),
        (chunk[:-1] + [negative], f"step {last.step} has a negative part",
         f"<steps {first.step}..{last.step}, the last one with token_states=-1>"),
        (chunk[:-1] + [bad_count], f"step {last.step} has a negative count of waiting requests",
         f"<steps {first.step}..{last.step}, the last one with waiting=-1>"),
        ([done[-1]] + chunk, f"step {done[-1].step} was added already: steps come in order, each once",
         f"<step {done[-1].step} again, then steps {first.step}..{last.step}>"),
    ]
    if len(chunk) > 1:
        cases.append((list(reversed(chunk)), "the steps of a chunk come in order",
                      f"<steps {last.step} down to {first.step}>"))
    for bad, why, shown in cases:
        _refused(meter, bad, why, shown, before)
