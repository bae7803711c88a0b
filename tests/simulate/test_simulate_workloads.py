"""Workload generators and trace loading for the simulator."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib.simulate import TRACES, WorkloadError, load_workload, make_workload, requests_from_lengths
from paged_kv_lib.simulate.workloads import _capped_mean, _lognormal_mu


@pytest.mark.parametrize("name", sorted(TRACES))
def test_generated_means_match_the_paper(name):
    shape = TRACES[name]
    workload = make_workload(name, 20000, seed=3)
    assert workload.mean_prompt() == pytest.approx(shape.prompt_mean, rel=0.04)
    assert workload.mean_output() == pytest.approx(shape.output_mean, rel=0.04)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_lengths_respect_limits_and_arrivals_are_poisson(name):
    workload = make_workload(name, 5000, seed=1, rate=0.25, max_len=512)
    assert len(workload) == 5000 and workload.max_len == 512
    arrivals = [r.arrival for r in workload.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    gaps = np.diff([0.0] + arrivals)
    assert gaps.mean() == pytest.approx(4.0, rel=0.06)  # exponential gaps of mean 1/rate
    assert gaps.std() == pytest.approx(4.0, rel=0.1)   # an exponential's std equals its mean
    for r in workload.requests:
        assert r.prompt_len >= 1 and r.output_len >= 1 and r.total_len <= 512


def test_long_tail_reaches_the_context_limit():
    lengths = [r.total_len for r in make_workload("sharegpt", 20000, seed=0).requests]
    assert max(lengths) == 2048  # some requests are cut at max_len
    assert np.median(lengths) < np.mean(lengths)  # right-skewed


def test_same_seed_same_workload_and_seeds_differ():
    assert make_workload("sharegpt", 200, seed=7) == make_workload("sharegpt", 200, seed=7)
    assert make_workload("sharegpt", 200, seed=7).requests != make_workload("sharegpt", 200, seed=8).requests


@given(mean=st.floats(5, 500), sigma=st.floats(0.2, 1.5), cap_factor=st.floats(1.5, 20))
@settings(max_examples=60)
def test_solved_mu_gives_the_capped_mean(mean, sigma, cap_factor):
    cap = mean * cap_factor
    mu = _lognormal_mu(mean, sigma, cap)
    assert _capped_mean(mu, sigma, cap) == pytest.approx(mean, rel=1e-6)


def test_capped_mean_formula_matches_sampling():
    rng = np.random.default_rng(0)
    samples = np.minimum(rng.lognormal(5.0, 0.9, 400000), 300.0)
    assert _capped_mean(5.0, 0.9, 300.0) == pytest.approx(samples.mean(), rel=0.005)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(name="nope", num_requests=5), WorkloadError),
        (dict(name="sharegpt", num_requests=0), ValueError),
        (dict(name="sharegpt", num_requests=2.5), TypeError),
        (dict(name="sharegpt", num_requests=5, rate=0.0), ValueError),
        (dict(name="sharegpt", num_requests=5, rate=float("inf")), ValueError),
        (dict(name="sharegpt", num_requests=5, rate="fast"), TypeError),
        (dict(name="sharegpt", num_requests=5, max_len=100), WorkloadError),  # mean 338 > 100
        (dict(name="sharegpt", num_requests=5, seed=-1), ValueError),
    ],
)
def test_bad_generator_arguments(kwargs, error):
    with pytest.raises(error):
        make_workload(**kwargs)


# ------------------------------------------------------------------ trace files
pairs = st.lists(st.tuples(st.integers(1, 900), st.integers(1, 900)), min_size=1, max_size=40)


@given(lengths=pairs, fmt=st.sampled_from(["csv", "json-objects", "json-pairs"]))
@settings(max_examples=40)
def test_trace_files_round_trip(tmp_path_factory, lengths, fmt):
    path = tmp_path_factory.mktemp("trace") / ("t.csv" if fmt == "csv" else "t.json")
    if fmt == "csv":
        path.write_text("prompt_len,output_len\n" + "".join(f"{p},{o}\n" for p, o in lengths))
    elif fmt == "json-objects":
        path.write_text(json.dumps([{"prompt_len": p, "output_len": o} for p, o in lengths]))
    else:
        path.write_text(json.dumps([[p, o] for p, o in lengths]))
    workload = load_workload(path, seed=2)
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == lengths
    assert workload.name == "t"
    again = load_workload(path, seed=2)
    assert again == workload  # arrivals drawn from the seed


def test_trace_with_arrivals_is_sorted_and_truncated(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("arrival,prompt_len,output_len\n5,10,20\n1.5,30,40\n3,50,60\n")
    workload = load_workload(path)
    assert [(r.arrival, r.prompt_len) for r in workload.requests] == [(1.5, 30), (3.0, 50), (5.0, 10)]
    assert len(load_workload(path, num_requests=2)) == 2


@pytest.mark.parametrize(
    "name, text, fragment",
    [
        ("missing.csv", None, "does not exist"),
        ("t.txt", "1,2\n", "must end in .csv or .json"),
        ("t.csv", "prompt,output\n1,2\n", "missing ['output_len', 'prompt_len']"),
        ("t.csv", "prompt_len,output_len\n", "holds no requests"),
        ("t.csv", "prompt_len,output_len\n3,4\n5,x\n", "row 3: output_len must be an integer >= 1, got 'x'"),
        ("t.csv", "prompt_len,output_len\n0,4\n", "row 2: prompt_len must be an integer >= 1"),
        ("t.csv", "prompt_len,output_len\n2000,100\n", "row 2: prompt_len + output_len = 2100 exceeds max_len 2048"),
        ("t.csv", "arrival,prompt_len,output_len\n1,2,3\n,2,3\n", "for every request or for none"),
        ("t.csv", "arrival,prompt_len,output_len\n-1,2,3\n", "arrival must be a number >= 0"),
        ("t.json", "{not json", "not valid JSON"),
        ("t.json", '{"prompt_len": 1}', "expected a JSON list"),
        ("t.json", '[[1, 2], "x"]', "item 1"),
        ("t.json", '[{"prompt_len": 1.5, "output_len": 2}]', "item 0: prompt_len"),
        ("t.json", '[{"prompt_len": true, "output_len": 2}]', "item 0: prompt_len"),
    ],
)
def test_bad_trace_files_name_the_problem(tmp_path, name, text, fragment):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert fragment in str(info.value)


def test_requests_from_lengths():
    workload = requests_from_lengths([(3, 4), (5, 6)], rate=2.0, seed=1, max_len=16)
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(3, 4), (5, 6)]
    assert all(math.isfinite(r.arrival) for r in workload.requests)
    with pytest.raises(WorkloadError, match="pair 1"):
        requests_from_lengths([(3, 4), (10, 10)], max_len=16)
    with pytest.raises(WorkloadError):
        requests_from_lengths([])
