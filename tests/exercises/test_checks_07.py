"""Exercise 07's checks bite: correct solutions pass with the one success line, planted wrong ones fail
(for the victim tasks, with a hint that names the mistake)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from check_helpers import fails, not_implemented, passes

# The checks themselves, not the notebook's guarded copies: these tests hand them the course's own classes.
from paged_kv_lib.block import cdiv
from paged_kv_course.grading import _checks_07_admission as admission
from paged_kv_course.grading.checks_07 import (check_plan_admission, check_choose_victims, check_choose_victims_by_priority, check_preemption_cost, check_victim_policy)
from paged_kv_course.grading import checks_07
from paged_kv_course.grading.delegation import forbidden_modules



@pytest.mark.parametrize(
    "check", [check_plan_admission, check_choose_victims, check_choose_victims_by_priority, check_preemption_cost]
)
def test_an_untouched_task_raises_not_implemented(check):
    with pytest.raises(NotImplementedError):
        check(not_implemented)


# --------------------------------------------------------------------------- 07.1
def plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots):
    """A correct answer, written apart from the check's reference."""
    if block_size < 1 or batch_slots < 0 or not 0 <= free_blocks <= total_blocks or not 0 <= watermark <= 1:
        raise ValueError("bad arguments")
    if min(prompt_tokens, default=0) < 0:
        raise ValueError("negative prompt")
    keep = math.ceil(watermark * total_blocks)
    admitted, rejected = [], []
    for i, tokens in enumerate(prompt_tokens):
        need = cdiv(tokens, block_size)
        if need > total_blocks - keep:
            rejected.append(i)
            continue
        if len(admitted) == batch_slots or free_blocks - need < keep:
            break
        free_blocks -= need
        admitted.append(i)
    return admitted, rejected


def test_plan_admission_correct(capsys):
    passes(check_plan_admission, plan_admission, "07.1", capsys)


def test_the_reference_rule_is_the_library_allocators():
    for args in admission._cases():
        assert admission._plan(*args) == admission._library_plan(*args), args


@pytest.mark.parametrize("name", list(admission.MISTAKES))
def test_plan_admission_names_each_mistake(name):
    switches = admission.MISTAKES[name]

    def wrong(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots):
        plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots)  # its errors
        return admission._plan(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots,
                               **switches)

    assert name in fails(check_plan_admission, wrong)


def test_plan_admission_refuses_a_changed_queue_and_a_wrong_type():
    def pops(prompt_tokens, *args):
        result = plan_admission(list(prompt_tokens), *args)
        prompt_tokens.clear()
        return result

    assert "do not modify the queue" in fails(check_plan_admission, pops)
    assert "a tuple of two lists" in fails(check_plan_admission, lambda *args: list(plan_admission(*args)))


def test_plan_admission_wants_each_bad_argument_refused():
    def lax(prompt_tokens, block_size, *args):
        return plan_admission([max(t, 0) for t in prompt_tokens], block_size, *args)

    assert "a prompt of -3 tokens" in fails(check_plan_admission, lax)


# --------------------------------------------------------------------------- 07.2
def choose_victims(running, free_blocks, *, newest=True, free_victims=True, reserve=True):
    """The solution, with switches that plant one bug each."""
    running = list(running)
    preempted, reserved, index = [], 0, 0
    while index < len(running):
        _, _, need = running[index]
        if need <= free_blocks - (reserved if reserve else 0):
            reserved += need
            index += 1
            continue
        victim_id, victim_blocks, _ = running.pop() if newest else running.pop(0)
        if not newest and index > 0:
            index -= 1  # the list shifted left under us
        preempted.append(victim_id)
        if free_victims:
            free_blocks += victim_blocks
    return preempted


def test_choose_victims_correct(capsys):
    passes(check_choose_victims, choose_victims, "07.2", capsys)


def preempts_the_asker(running, free_blocks):
    """Preempts the request that needs a block instead of the newest one."""
    running = list(running)
    preempted, reserved, index = [], 0, 0
    while index < len(running):
        request_id, held, need = running[index]
        if need <= free_blocks - reserved:
            reserved += need
            index += 1
        else:
            running.pop(index)
            preempted.append(request_id)
            free_blocks += held
    return preempted


def one_victim_at_most(running, free_blocks):
    running = list(running)
    preempted, reserved, index = [], 0, 0
    while index < len(running):
        request_id, _, need = running[index]
        if need > free_blocks - reserved and not preempted:
            victim_id, victim_blocks, _ = running.pop()
            preempted.append(victim_id)
            free_blocks += victim_blocks
            if victim_id == request_id:
                break
        reserved += need
        index += 1
    return preempted


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda r, f: choose_victims(r, f, newest=False), "preempted the oldest"),
        (lambda r, f: choose_victims(r, f, free_victims=False), "never came back"),
        (lambda r, f: choose_victims(r, f, reserve=False), "reserved by older requests"),
        (preempts_the_asker, "the request that needed the block"),
        (one_victim_at_most, "engine's rule"),
        (lambda r, f: list(reversed(choose_victims(r, f))), "wrong order"),
        (lambda r, f: tuple(choose_victims(r, f)), "a list"),
    ],
    ids=["oldest", "no-free", "no-reserve", "asker", "one-victim", "order", "tuple"],
)
def test_choose_victims_wrong(wrong, words):
    assert words in fails(check_choose_victims, wrong)


def test_choose_victims_that_modifies_running_fails():
    def pops(running, free_blocks):
        out = choose_victims(running, free_blocks)
        running.clear()
        return out
    assert "modified its input" in fails(check_choose_victims, pops)


# --------------------------------------------------------------------------- 07.3
def by_priority(running, free_blocks, *, key=lambda r, j: (r[1], j), served_too=True, give_back=True):
    """The solution of 07.3, with switches that plant one mistake each."""
    alive = list(running)
    out, reserved, i = [], 0, 0
    while i < len(alive):
        need = alive[i][3]
        if need <= free_blocks - reserved:
            reserved += need
            i += 1
            continue
        candidates = range(len(alive)) if served_too else range(i, len(alive))
        j = max(candidates, key=lambda j: key(alive[j], j))
        victim = alive.pop(j)
        out.append(victim[0])
        free_blocks += victim[2]
        if j < i:
            if give_back:
                reserved -= victim[3]
            i -= 1
    return out


def test_choose_victims_by_priority_correct(capsys):
    passes(check_choose_victims_by_priority, by_priority, "07.3", capsys)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda r, f: by_priority(r, f, key=lambda q, j: j), "whatever its priority"),
        (lambda r, f: by_priority(r, f, key=lambda q, j: (-q[1], j)), "MOST important"),
        (lambda r, f: by_priority(r, f, key=lambda q, j: (q[1], -j)), "among equal priorities"),
        (lambda r, f: by_priority(r, f, served_too=False), "already served"),
        (lambda r, f: by_priority(r, f, give_back=False), "reservation back"),
        (lambda r, f: choose_victims([(q[0], q[2], q[3]) for q in r], f), "whatever its priority"),
    ],
    ids=["newest", "inverted", "oldest-of-equals", "not-served", "keeps-reservation", "engine-rule"],
)
def test_choose_victims_by_priority_names_the_mistake(wrong, words):
    assert words in fails(check_choose_victims_by_priority, wrong)


# --------------------------------------------------------------------------- 07.4
def preemption_cost(prompt_len, num_generated, block_size, mode):
    held = math.ceil((prompt_len + num_generated - 1) / block_size)
    if mode == "recompute":
        tokens = prompt_len + num_generated
        return {"freed_blocks": held, "blocks_copied": 0, "prefill_tokens": tokens,
                "blocks_on_resume": math.ceil(tokens / block_size)}
    return {"freed_blocks": held, "blocks_copied": 2 * held, "prefill_tokens": 0, "blocks_on_resume": held}


def test_preemption_cost_correct(capsys):
    passes(check_preemption_cost, preemption_cost, "07.4", capsys)


def counts_the_unfed_token(prompt_len, num_generated, block_size, mode):
    return preemption_cost(prompt_len + 1, num_generated, block_size, mode) | (
        {"prefill_tokens": prompt_len + num_generated} if mode == "recompute" else {})


def recomputes_only_the_prompt(prompt_len, num_generated, block_size, mode):
    cost = preemption_cost(prompt_len, num_generated, block_size, mode)
    if mode == "recompute":
        cost["prefill_tokens"] = prompt_len
        cost["blocks_on_resume"] = math.ceil(prompt_len / block_size)
    return cost


def swap_copies_one_way(prompt_len, num_generated, block_size, mode):
    cost = preemption_cost(prompt_len, num_generated, block_size, mode)
    if mode == "swap":
        cost["blocks_copied"] //= 2
    return cost


def recompute_resumes_with_held_blocks(prompt_len, num_generated, block_size, mode):
    cost = preemption_cost(prompt_len, num_generated, block_size, mode)
    cost["blocks_on_resume"] = cost["freed_blocks"]
    return cost


def floor_division(prompt_len, num_generated, block_size, mode):
    held = (prompt_len + num_generated - 1) // block_size
    tokens = prompt_len + num_generated
    if mode == "recompute":
        return {"freed_blocks": held, "blocks_copied": 0, "prefill_tokens": tokens,
                "blocks_on_resume": tokens // block_size}
    return {"freed_blocks": held, "blocks_copied": 2 * held, "prefill_tokens": 0, "blocks_on_resume": held}


def extra_key(prompt_len, num_generated, block_size, mode):
    return preemption_cost(prompt_len, num_generated, block_size, mode) | {"mode": mode}


@pytest.mark.parametrize(
    "wrong",
    [counts_the_unfed_token, recomputes_only_the_prompt, swap_copies_one_way, recompute_resumes_with_held_blocks,
     floor_division, extra_key],
)
def test_preemption_cost_wrong(wrong):
    fails(check_preemption_cost, wrong)


# --------------------------------------------------------------------------- 07.5
def fewest_held(running, asking):
    return min(running, key=lambda r: r[1])[0]


def test_victim_policy_that_beats_newest_first_passes(capsys):
    passes(check_victim_policy, fewest_held, "07.5", capsys)


def test_victim_policy_figures_beside_newest_first(capsys, monkeypatch):
    monkeypatch.setattr(checks_07, "PRINT_FIGURES_ON_PASS", True)
    check_victim_policy(fewest_held)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "PASSED 07.5"
    assert "newest-first" in out[-2] and "yours" in out[-2]  # the learner's figure beside the engine's


def test_victim_policy_untouched_says_not_written():
    with pytest.raises(NotImplementedError):
        check_victim_policy(not_implemented)


def test_victim_policy_that_modifies_running_fails():
    def pops(running, asking):
        return running.pop()[0]
    assert "modified the list" in fails(check_victim_policy, pops)


def test_victim_policy_threshold_is_measured_not_fixed():
    """The bar moves with the workloads: a policy just as good as newest-first fails, one better passes."""
    assert "at most 90%" in fails(check_victim_policy, lambda running, asking: running[-1][0])


PLANTED = Path(__file__).parent / "planted" / "07"
TASKS = {"07.1": (check_plan_admission, "plan_admission"), "07.2": (check_choose_victims, "choose_victims"),
         "07.3": (check_choose_victims_by_priority, "choose_victims_by_priority"),
         "07.4": (check_preemption_cost, "preemption_cost"), "07.5": (check_victim_policy, "choose_victim")}


@pytest.mark.parametrize("path", sorted(PLANTED.glob("07_*.py")), ids=lambda p: p.stem)
def test_a_planted_mistake_is_named(path):
    source = path.read_text(encoding="utf-8")
    expect = source.splitlines()[0].removeprefix("# expect: ")
    check, name = TASKS[f"07.{path.stem.split('_')[1]}"]
    namespace: dict = {"math": math, "cdiv": cdiv}  # what the setup cell defines
    exec(compile(source, str(path), "exec"), namespace)
    assert expect in fails(check, namespace[name])


def test_every_task_has_a_planted_mistake():
    assert {f"07.{p.stem.split('_')[1]}" for p in PLANTED.glob("07_*.py")} == set(TASKS)


def test_the_library_that_answers_is_forbidden():
    forbidden = forbidden_modules("07")
    for name in ("paged_kv_course.grading", "paged_kv_lib.engine", "paged_kv_lib.allocator", "paged_kv_lib.simulate"):
        assert name in forbidden
