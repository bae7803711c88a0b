"""Exercise 08's checks bite: correct solutions pass with the one success line, planted wrong ones fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_helpers import fails, not_implemented, passes

# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_course.grading.checks_08 import (check_allocator_in_simulation, check_memory_parts, check_reservation_slots, check_block_size_choice, check_memory_meter)
from paged_kv_course.grading import checks_08
from paged_kv_lib.block import cdiv
from paged_kv_course.starters.after_06 import AllocatorAfter06
from paged_kv_course.grading.delegation import forbidden_modules
from paged_kv_lib.simulate import StepSnapshot
from planted_harness import is_delegation


@pytest.mark.parametrize(
    "check", [check_reservation_slots, check_memory_parts, check_memory_meter, check_allocator_in_simulation,
              check_block_size_choice]
)
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 08.1
def reservation_slots(kind, prompt_len, output_len, max_len):
    if kind in ("orca-max", "orca-pow2", "orca-oracle") and min(prompt_len, output_len) < 1:
        raise ValueError("a request has a prompt and generates at least one token")
    if kind == "orca-max":
        return max_len
    if kind == "orca-pow2":
        return min(prompt_len + (1 << (output_len - 1).bit_length()), max_len)
    if kind == "orca-oracle":
        return prompt_len + output_len
    raise ValueError(f"unknown reservation kind {kind!r}")


def test_reservation_slots_correct(capsys):
    passes(check_reservation_slots, reservation_slots, "08.1", capsys)


def pow2_of_total(kind, p, o, m):  # rounds prompt + output, not the output alone
    return min(1 << (p + o - 1).bit_length(), m) if kind == "orca-pow2" else reservation_slots(kind, p, o, m)


def pow2_uncapped(kind, p, o, m):  # forgets the maximum length
    return p + (1 << (o - 1).bit_length()) if kind == "orca-pow2" else reservation_slots(kind, p, o, m)


def pow2_one_too_far(kind, p, o, m):  # 32 -> 64: bit_length of o instead of o - 1
    return min(p + (1 << o.bit_length()), m) if kind == "orca-pow2" else reservation_slots(kind, p, o, m)


def pow2_float(kind, p, o, m):  # math.pow gives a float
    import math

    return min(p + math.pow(2, math.ceil(math.log2(o))), m) if kind == "orca-pow2" else reservation_slots(kind, p, o, m)


def max_is_total(kind, p, o, m):  # orca-max reserving the request's own length
    return p + o if kind == "orca-max" else reservation_slots(kind, p, o, m)


def output_zero_accepted(kind, p, o, m):  # the bit_length rule gives p + 2 for o == 0
    if kind == "orca-max":
        return m
    if kind == "orca-pow2":
        return min(p + (1 << (o - 1).bit_length()), m)
    if kind == "orca-oracle":
        return p + o
    raise ValueError(kind)


def unknown_returns_none(kind, p, o, m):
    if kind in ("orca-max", "orca-pow2", "orca-oracle"):
        return reservation_slots(kind, p, o, m)
    return None


def pow2_rounds_down(kind, p, o, m):  # the largest power of two <= o
    return min(p + (1 << (o.bit_length() - 1)), m) if kind == "orca-pow2" else reservation_slots(kind, p, o, m)


def max_plus_prompt(kind, p, o, m):
    return p + m if kind == "orca-max" else reservation_slots(kind, p, o, m)


@pytest.mark.parametrize("wrong, words", [
    (pow2_of_total, "prompt included"),
    (pow2_uncapped, "the cap is missing"),
    (pow2_one_too_far, "stays itself"),
    (pow2_rounds_down, "rounded down"),
    (pow2_float, "return an int"),
    (max_is_total, "this is the orca-oracle reservation"),
    (max_plus_prompt, "max_len in all"),
    (unknown_returns_none, "unknown kind"),
    (output_zero_accepted, "output_len=0 is not a request"),
])
def test_reservation_slots_names_the_part_that_differs(wrong, words):
    message = fails(check_reservation_slots, wrong)
    assert words in message
    assert "rounded up to a power of two (1 -> 1" not in message  # the recipe is not restated


def test_output_length_zero_is_named():
    assert "output_len=0 is not a request" in fails(check_reservation_slots, output_zero_accepted)


# --------------------------------------------------------------------------- 08.2
def memory_parts(capacity, running, free_holes, first_waiting, *, variant=None):
    tokens = sum(held for held, _, _ in running)
    filled_by_end = [min(slots, final_len) for _, final_len, slots in running]
    if variant == "reserved-to-final":
        filled_by_end = [final_len for _, final_len, _ in running]
    reserved = sum(f - held for f, (held, _, _) in zip(filled_by_end, running))
    held_slots = sum(slots for _, _, slots in running)
    free_total = sum(free_holes)
    internal = held_slots - sum(filled_by_end)
    if variant != "no-unusable":
        internal += capacity - held_slots - free_total
    largest = max(free_holes) if variant == "max-of-empty" else max(free_holes, default=0)
    if first_waiting is None:
        blocked = False
    elif variant == "no-total-condition":
        blocked = first_waiting > largest
    else:
        blocked = largest < first_waiting <= free_total
    external = free_total if blocked else 0
    if variant == "partial-external" and blocked:
        external = free_total - largest
    return {"token_states": tokens, "reserved": reserved, "internal": internal,
            "external": external, "free": free_total - external}


def test_memory_parts_correct(capsys):
    passes(check_memory_parts, memory_parts, "08.2", capsys)


@pytest.mark.parametrize("variant, words", [
    ("reserved-to-final", "does not hold yet"),
    ("no-unusable", "neither held nor free"),
    ("max-of-empty", "raised"),
    ("no-total-condition", "more than all free slots together"),
    ("partial-external", "differ"),
])
def test_memory_parts_names_the_part_that_differs(variant, words):
    message = fails(check_memory_parts, lambda *args: memory_parts(*args, variant=variant))
    assert words in message
    assert "min(slots, final_len)" not in message  # the recipe is not restated


def test_memory_parts_wants_ints_and_the_five_keys():
    def as_fractions(capacity, running, free_holes, first_waiting):
        parts = memory_parts(capacity, running, free_holes, first_waiting)
        return {key: value / capacity for key, value in parts.items()}

    def short_keys(*args):
        parts = memory_parts(*args)
        return {"tokens": parts.pop("token_states"), **parts}

    assert "int" in fails(check_memory_parts, as_fractions)
    assert "keys" in fails(check_memory_parts, short_keys)


# --------------------------------------------------------------------------- 08.3
class Meter:
    """A correct MemoryMeter, written apart from the notebook's: it keeps the snapshots and recomputes."""

    PARTS = ("token_states", "reserved", "internal", "external", "free")

    def __init__(self, capacity, *, variant=None):
        if variant != "any-capacity" and capacity < 1:
            raise ValueError("capacity")
        self.capacity, self.variant, self.snaps = capacity, variant, []

    def add(self, snapshots):
        chunk = list(snapshots)
        last = self.snaps[-1].step if self.snaps else None
        for snap in chunk:
            total = sum(getattr(snap, p) for p in self.PARTS)
            if self.variant == "lazy" and (total != self.capacity):
                raise ValueError("parts")
            if self.variant == "lazy":
                self.snaps.append(snap)
                continue
            if total != self.capacity or min(getattr(snap, p) for p in self.PARTS) < 0 or snap.waiting < 0:
                raise ValueError("parts")
            if last is not None and snap.step <= last:
                raise ValueError("order")
            last = snap.step
        if self.variant != "lazy":
            self.snaps.extend(chunk)

    def summary(self):
        if not self.snaps:
            raise ValueError("empty")
        loaded = [s for s in self.snaps if s.waiting > 0]
        window = self.snaps if self.variant == "all-steps" else (loaded or self.snaps)
        out = {p: sum(getattr(s, p) for s in window) / len(window) / self.capacity for p in self.PARTS}
        out["mean_batch"] = sum(s.running for s in window) / len(window)
        out["window"] = "loaded" if loaded else "busy"
        out["window_steps"] = len(window)
        return out


def test_memory_meter_correct(capsys):
    passes(check_memory_meter, Meter, "08.3", capsys)


@pytest.mark.parametrize("variant, words", [
    ("all-steps", "steps of both kinds"),
    ("any-capacity", "at least one slot"),
    ("lazy", "step"),
])
def test_memory_meter_names_each_mistake(variant, words):
    assert words in fails(check_memory_meter, lambda capacity: Meter(capacity, variant=variant))


# --------------------------------------------------------------------------- 08.4
class MyAllocator(AllocatorAfter06):
    """A bookkeeping-only allocator in the course's contract: the course's own answer once exercise 06 is done."""

    def _take(self, count):
        """The planted classes' way to take blocks: refused when too few are free, as a learner's would be."""
        if count > len(self.free):
            raise RuntimeError(f"need {count} blocks, {len(self.free)} free")
        return self.take_blocks(count)


class EmptyMappingForUnknown(MyAllocator):
    """Answers an unknown sequence with an empty mapping instead of refusing it."""

    def get_block_mapping(self, seq_id):
        return list(self.tables.get(seq_id, []))


class GrowsAnUnknownSequence(MyAllocator):
    """Starts a sequence that was never allocated when asked to grow it."""

    def append_tokens(self, seq_id, num_tokens=1):
        self.tables.setdefault(seq_id, [])
        self.lengths.setdefault(seq_id, 0)
        return super().append_tokens(seq_id, num_tokens)


def test_allocator_in_simulation_refuses_unknown_sequences_first():
    assert "so it has no mapping" in fails(check_allocator_in_simulation, EmptyMappingForUnknown)
    assert "so it cannot grow" in fails(check_allocator_in_simulation, GrowsAnUnknownSequence)


class OneBlockEarly(MyAllocator):
    """The seed's growth rule: a new block as soon as the count reaches a multiple of the block size."""

    def append_tokens(self, seq_id, num_tokens=1):
        if seq_id not in self.tables:
            raise ValueError(f"no sequence {seq_id}")
        n = self.lengths[seq_id] + num_tokens
        taken = self._take(n // self.block_size + 1 - len(self.tables[seq_id]))
        self.tables[seq_id].extend(taken)
        self.lengths[seq_id] = n
        return taken


class PromptPlusOne(MyAllocator):
    """n // block_size + 1 blocks for a prompt."""

    def allocate_for_sequence(self, seq_id, num_prompt_tokens):
        self.tables[seq_id] = self._take(num_prompt_tokens // self.block_size + 1)
        self.lengths[seq_id] = num_prompt_tokens


class KeepsFreedBlocks(MyAllocator):
    def free_sequence(self, seq_id):
        self.tables.pop(seq_id, None)
        self.lengths.pop(seq_id, None)


class ReturnsNone(MyAllocator):
    def append_tokens(self, seq_id, num_tokens=1):
        super().append_tokens(seq_id, num_tokens)


def test_allocator_in_simulation_correct(capsys):
    passes(check_allocator_in_simulation, MyAllocator, "08.4", capsys)


def test_allocator_in_simulation_prints_the_paper_figure_when_asked(capsys, monkeypatch):
    monkeypatch.setattr(checks_08, "PRINT_FIGURES_ON_PASS", True)
    check_allocator_in_simulation(MyAllocator)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "PASSED 08.4"
    assert any(line.startswith("MyAllocator") for line in out) and any("orca-oracle" in line for line in out)


def test_allocator_in_simulation_makes_a_modest_number_of_calls(capsys, monkeypatch):
    monkeypatch.setattr(checks_08, "PRINT_FIGURES_ON_PASS", False)  # the paper-sized figure is skipped under the judge
    calls = []

    class Counting(MyAllocator):
        def __getattribute__(self, name):
            if not name.startswith("_") and name not in ("block_size", "num_blocks", "free", "ref_counts", "tables", "lengths",
                                                                 "take_blocks"):
                calls.append(name)
            return super().__getattribute__(name)

    passes(check_allocator_in_simulation, Counting, "08.4", capsys)
    assert len(calls) < 4000, len(calls)


WRONG_ALLOCATORS = {
    OneBlockEarly: "more slots than the library's",
    PromptPlusOne: "more slots than the library's",
    KeepsFreedBlocks: "given back",
    ReturnsNone: "list of block ids",
}


@pytest.mark.parametrize("cls", list(WRONG_ALLOCATORS), ids=lambda c: c.__name__)
def test_allocator_in_simulation_wrong(cls):
    message = fails(check_allocator_in_simulation, cls)
    assert WRONG_ALLOCATORS[cls] in message


# --------------------------------------------------------------------------- 08.5
def footprint_model(requests, capacity_tokens, speed):
    footprint = sum(p + o / 2 for p, o in requests) / len(requests)
    return max(speed, key=lambda size: speed[size] / (footprint + size / 2))


def test_block_size_from_a_footprint_model_passes(capsys):
    passes(check_block_size_choice, footprint_model, "08.5", capsys)


def test_block_size_figures_beside_the_best_measured(capsys, monkeypatch):
    monkeypatch.setattr(checks_08, "PRINT_FIGURES_ON_PASS", True)
    check_block_size_choice(footprint_model)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "PASSED 08.5"
    assert all("yours B=" in line and "the best measured B=" in line for line in out[1:-1])


@pytest.mark.parametrize("size", sorted(checks_08.KERNEL_SPEED))
def test_no_single_block_size_passes_every_workload(size):
    assert "serving at" in fails(check_block_size_choice, lambda requests, capacity, speed: size)


def test_a_block_size_the_kernel_does_not_offer_fails():
    assert "block sizes the kernel offers" in fails(check_block_size_choice, lambda r, c, s: 12)


PLANTED = Path(__file__).parent / "planted" / "08"
TASKS = {"08.1": (check_reservation_slots, "reservation_slots"), "08.2": (check_memory_parts, "memory_parts"),
         "08.3": (check_memory_meter, "MemoryMeter"), "08.4": (check_allocator_in_simulation, "MyAllocator"),
         "08.5": (check_block_size_choice, "choose_block_size")}


@pytest.mark.parametrize("path", [p for p in sorted(PLANTED.glob("08_*.py")) if not is_delegation(p)],
                         ids=lambda p: p.stem)
def test_a_planted_mistake_is_named(path):
    source = path.read_text(encoding="utf-8")
    expect = source.splitlines()[0].removeprefix("# expect: ")
    check, name = TASKS[f"08.{path.stem.split('_')[1]}"]
    namespace: dict = {"StepSnapshot": StepSnapshot, "cdiv": cdiv}  # what the setup cell defines
    exec(compile(source, str(path), "exec"), namespace)
    assert expect in fails(check, namespace[name])


def test_every_task_has_a_planted_mistake():
    assert {f"08.{p.stem.split('_')[1]}" for p in PLANTED.glob("08_*.py")} == set(TASKS)


def test_the_library_that_answers_is_forbidden():
    forbidden = forbidden_modules("08")
    for name in ("paged_kv_course.grading", "paged_kv_lib.allocator", "paged_kv_lib.block_manager",
                 "paged_kv_lib.simulate.reservation", "paged_kv_lib.simulate.metrics", "paged_kv_course.conformance"):
        assert name in forbidden
