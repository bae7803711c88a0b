"""The shared scheduler, the memory models and the five-part accounting."""

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib.simulate import ALLOCATORS, PARTS, make_memory, make_workload, requests_from_lengths, run_schedule
from paged_kv_lib.simulate.job import Job
from paged_kv_lib.simulate.paged import PagedMemory
from paged_kv_lib.simulate.reservation import reservation_size
from paged_kv_lib.simulate.workloads import TraceRequest, Workload


def run(workload, name, capacity, block_size=16, fit="buddy", check=True):
    snaps = []
    memory = make_memory(name, capacity, block_size=block_size, max_len=workload.max_len, fit=fit)
    result = run_schedule(workload, memory, on_step=snaps.append, check=check)
    return result, snaps, memory


def averages(snaps, capacity):
    """The window averages recomputed from the per-step snapshots."""
    window = [s for s in snaps if s.loaded] or [s for s in snaps if s.running]
    parts = {p: sum(getattr(s, p) for s in window) / (len(window) * capacity) for p in PARTS}
    return parts, sum(s.running for s in window) / len(window), len(window)


CONFIGS = [(name, fit) for name in ALLOCATORS[:3] for fit in ("buddy", "first-fit", "best-fit")]


@pytest.mark.parametrize("name, fit", CONFIGS + [("paged", "buddy")])
def test_every_step_recounts_and_sums_to_capacity(name, fit):
    workload = make_workload("sharegpt", 60, seed=5, max_len=1024)
    result, snaps, _ = run(workload, name, 5000, fit=fit)  # check=True recounts every step
    assert result.finished == 60
    assert snaps and all(s.total() == 5000 for s in snaps)
    assert sum(getattr(result, p) for p in PARTS) == pytest.approx(1.0)
    parts, batch, count = averages(snaps, 5000)
    assert result.window == "loaded" and result.window_steps == count
    for p in PARTS:
        assert getattr(result, p) == pytest.approx(parts[p])
    assert result.mean_batch == pytest.approx(batch)


workloads = st.lists(
    st.tuples(st.floats(0, 30), st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=25
)


@given(requests=workloads, name=st.sampled_from(ALLOCATORS), block_size=st.sampled_from([1, 2, 3, 8, 16]),
       capacity=st.integers(130, 400), fit=st.sampled_from(["buddy", "first-fit", "best-fit"]))
@settings(max_examples=120)
def test_random_workloads_finish_with_consistent_accounting(requests, name, block_size, capacity, fit):
    reqs = tuple(sorted(TraceRequest(a, p, o) for a, p, o in requests))
    workload = Workload("random", reqs, max_len=80)
    result, snaps, memory = run(workload, name, capacity, block_size=block_size, fit=fit)
    assert result.finished == len(reqs)
    assert all(s.total() == capacity for s in snaps)
    assert min(min(getattr(s, p) for p in PARTS) for s in snaps) >= 0
    # Every token of every request was held at some step: total token-steps is at least
    # what each request needs from its admission to its end.
    assert sum(s.token_states for s in snaps) >= sum(
        sum(range(r.prompt_len + 1, r.total_len + 1)) for r in reqs
    )
    if name != "paged":
        assert result.preemptions == 0
    assert memory.tokens == 0 and memory.internal == 0 and memory.allocated() == 0  # all released


def test_paged_calls_append_tokens_for_every_generated_token():
    workload = make_workload("alpaca", 80, seed=2)
    memory = PagedMemory(16000, 16)  # big enough: no preemption
    calls = []
    real = memory.allocator.append_tokens

    def spy(seq_id, num_tokens=1):
        calls.append(num_tokens)
        return real(seq_id, num_tokens)

    memory.allocator.append_tokens = spy
    result = run_schedule(workload, memory)
    assert result.preemptions == 0
    assert calls == [1] * sum(r.output_len for r in workload.requests)


def test_preemption_frees_the_newest_and_requeues_it_first():
    memory = PagedMemory(6, 2)  # 3 blocks of 2 slots
    jobs = [Job(0, TraceRequest(0.0, 2, 5)), Job(1, TraceRequest(0.0, 3, 5)), Job(2, TraceRequest(0.0, 1, 5))]
    assert memory.admit(jobs[0], 0)  # 1 block, full
    assert memory.admit(jobs[1], 0)  # 2 blocks, one slot to spare
    assert not memory.admit(jobs[2], 0)  # no block left
    running, waiting = [jobs[0], jobs[1]], deque([jobs[2]])
    memory.generate(running, waiting, 0)  # job 0 needs a block: job 1 (the newest) goes
    assert running == [jobs[0]] and list(waiting) == [jobs[1], jobs[2]]
    assert memory.preemptions == 1 and jobs[1].prefill == 3 and jobs[1].epoch == 1
    assert memory.allocator.get_num_tokens(0) == 3 and 1 not in memory.allocator
    assert memory.tokens == 3 and memory.allocator.num_free_blocks == 1
    memory.check()


def test_a_lone_newest_request_preempts_itself():
    memory = PagedMemory(4, 2)
    jobs = [Job(0, TraceRequest(0.0, 1, 3)), Job(1, TraceRequest(0.0, 1, 3))]
    assert memory.admit(jobs[0], 0) and memory.admit(jobs[1], 0)
    running, waiting = list(jobs), deque()
    memory.generate(running, waiting, 0)  # both hold 2 tokens: pool full
    memory.generate(running, waiting, 1)  # job 0 needs a block: job 1 goes, job 0 grows
    assert running == [jobs[0]] and list(waiting) == [jobs[1]]


def test_contiguous_reservations_follow_the_paper():
    assert reservation_size("orca-max", 10, 25, 2048) == 2048
    assert reservation_size("orca-pow2", 10, 25, 2048) == 10 + 32  # the output is rounded up
    assert reservation_size("orca-pow2", 1500, 600, 2048) == 2048  # capped at max
    assert reservation_size("orca-oracle", 10, 25, 2048) == 35
    with pytest.raises(ValueError, match="unknown reservation"):
        reservation_size("orca-min", 1, 1, 2048)


def test_orca_max_keeps_seven_requests_and_the_rest_free():
    workload = make_workload("sharegpt", 40, seed=0)
    result, snaps, _ = run(workload, "orca-max", 15728, check=False)
    loaded = [s for s in snaps if s.loaded]
    assert all(s.running == 7 for s in loaded)
    assert all(s.free == 15728 - 7 * 2048 and s.external == 0 for s in loaded)
    assert result.mean_batch == 7.0


def test_external_fragmentation_is_counted_when_free_space_is_split():
    # 16 slots, first-fit, exact sizes: three 4-slot requests fill slots 0-11 and an
    # 8-slot one waits. While only 12-15 are free it is short of memory ("free"); once
    # the middle request (4-7) leaves, 8 slots are free but split: external.
    reqs = (TraceRequest(0, 1, 3), TraceRequest(0, 3, 1), TraceRequest(0, 1, 3), TraceRequest(0, 4, 4))
    result, snaps, _ = run(Workload("split", reqs, max_len=16), "orca-oracle", 16, fit="first-fit")
    assert result.finished == 4
    assert [(s.step, s.external, s.free, s.waiting) for s in snaps[:4]] == [
        (0, 0, 4, 1), (1, 8, 0, 1), (2, 8, 0, 1), (3, 0, 8, 0)
    ]
    assert result.external == pytest.approx(8 / 16 * 2 / 3)  # 2 of the 3 loaded steps


def test_light_load_averages_over_busy_steps():
    workload = make_workload("alpaca", 30, seed=0, rate=0.001)
    result, snaps, _ = run(workload, "paged", 4000, check=False)
    assert result.window == "busy" and result.preemptions == 0
    assert result.window_steps == sum(1 for s in snaps if s.running)


def test_requests_that_can_never_fit_are_refused_up_front():
    workload = requests_from_lengths([(10, 10), (100, 30)], max_len=200)
    with pytest.raises(ValueError, match="request 1"):
        run_schedule(workload, make_memory("paged", 128, block_size=16, max_len=200))
    with pytest.raises(ValueError, match="orca-max"):
        run_schedule(workload, make_memory("orca-max", 150, max_len=200))
    with pytest.raises(ValueError, match="larger than the capacity"):
        make_memory("paged", 8, block_size=16)
    with pytest.raises(ValueError, match="unknown allocator"):
        make_memory("vllm", 100)
    with pytest.raises(ValueError, match="fit"):
        make_memory("orca-oracle", 100, fit="worst-fit")


def test_results_are_deterministic():
    workload = make_workload("sharegpt", 50, seed=4)
    first = [run(workload, n, 8000, check=False)[0] for n in ALLOCATORS]
    again = [run(workload, n, 8000, check=False)[0] for n in ALLOCATORS]
    assert first == again


def test_admission_leaves_room_for_the_first_generated_token():
    memory = PagedMemory(4, 2)  # 2 blocks
    assert memory.admit(Job(0, TraceRequest(0.0, 2, 3)), 0)  # takes 1 block, its prompt fills it
    assert not memory.admit(Job(1, TraceRequest(0.0, 2, 3)), 0)  # its prompt alone would fit in the last block
    assert memory.admit(Job(2, TraceRequest(0.0, 1, 3)), 0)
