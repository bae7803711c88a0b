"""The error contract for the simulation: every bad input to ``paged_kv_lib.simulate``'s public
functions, and to ``paged-kv simulate`` raises a
``PagedKVError`` subclass (also the built-in a caller expects), names the value and the limit,
and changes nothing.

Each case gives the call, the error class it must raise and a pattern the message must match:
the pattern holds the bad value and the limit it broke, so a bare ``raise ValueError()`` or a
message that drops either part fails here.
"""

from __future__ import annotations

import argparse
import os

import pytest

from paged_kv_lib.errors import InvalidArgumentError, InvalidTypeError, PagedKVError
from paged_kv_lib.simulate import (
    ContiguousAllocator,
    WorkloadError,
    load_workload,
    make_memory,
    make_workload,
    requests_from_lengths,
    run_schedule,
    simulate,
)
from paged_kv_lib.simulate import cli as sim_cli
from paged_kv_lib.simulate.buddy import BuddyAllocator
from paged_kv_lib.simulate.reservation import reservation_size

W = requests_from_lengths([(3, 4), (5, 2), (2, 6)], seed=1)  # small: a wrong early exit would still be quick


CASES = [
    # workloads
    ("make_workload unknown name", lambda: make_workload("gpt4", 10), WorkloadError, r"'gpt4'.*sharegpt"),
    ("make_workload unhashable name", lambda: make_workload(["a"], 10), WorkloadError, r"\['a'\].*alpaca"),
    ("make_workload no requests", lambda: make_workload("sharegpt", 0), InvalidArgumentError,
     r"num_requests must be >= 1, got 0"),
    ("make_workload float count", lambda: make_workload("sharegpt", 2.5), InvalidTypeError,
     r"num_requests must be an int, got float 2.5"),
    ("make_workload negative seed", lambda: make_workload("sharegpt", 5, seed=-1), InvalidArgumentError,
     r"seed must be >= 0, got -1"),
    ("make_workload zero rate", lambda: make_workload("sharegpt", 5, rate=0), InvalidArgumentError,
     r"rate must be a finite number > 0, got 0"),
    ("make_workload infinite rate", lambda: make_workload("sharegpt", 5, rate=float("inf")),
     InvalidArgumentError, r"rate must be a finite number > 0, got inf"),
    ("make_workload text rate", lambda: make_workload("sharegpt", 5, rate="fast"), InvalidTypeError,
     r"rate must be a number, got str 'fast'"),
    ("make_workload tiny max_len", lambda: make_workload("sharegpt", 5, max_len=1), InvalidArgumentError,
     r"max_len must be >= 2, got 1"),
    ("load_workload not a path", lambda: load_workload(123), InvalidTypeError, r"path must be .*got int 123"),
    ("load_workload missing", lambda: load_workload("no/such/trace.csv"), WorkloadError,
     r"'no/such/trace.csv' does not exist"),
    ("requests_from_lengths not iterable", lambda: requests_from_lengths(5), InvalidTypeError,
     r"lengths must be an iterable.*int 5"),
    ("requests_from_lengths triple", lambda: requests_from_lengths([(1, 2, 3)]), WorkloadError,
     r"pair 0: expected 2 values .*got 3"),
    ("requests_from_lengths a number per pair", lambda: requests_from_lengths([7]), InvalidTypeError,
     r"pair 0: expected \(prompt_len, output_len\), got 7"),
    ("requests_from_lengths empty", lambda: requests_from_lengths([]), WorkloadError, r"at least one request"),
    ("requests_from_lengths empty prompt", lambda: requests_from_lengths([(0, 5)]), WorkloadError,
     r"prompt_len must be an integer >= 1, got 0"),
    ("requests_from_lengths too long", lambda: requests_from_lengths([(30, 5)], max_len=32), WorkloadError,
     r"= 35 exceeds max_len 32"),
    # memory models and the runner
    ("make_memory unknown", lambda: make_memory("lru", 100), InvalidArgumentError, r"'lru'.*orca-max"),
    ("make_memory no capacity", lambda: make_memory("paged", 0), InvalidArgumentError,
     r"capacity_tokens must be >= 1, got 0"),
    ("make_memory block past capacity", lambda: make_memory("paged", 8, block_size=16), InvalidArgumentError,
     r"block_size 16 is larger than the capacity of 8"),
    ("make_memory unknown fit", lambda: make_memory("orca-max", 100, fit="worst-fit"), InvalidArgumentError,
     r"fit must be one of .*buddy.*got 'worst-fit'"),
    ("simulate not a workload", lambda: simulate("sharegpt"), InvalidTypeError, r"must be a Workload.*str"),
    ("simulate a lone string", lambda: simulate(W, 100, "paged"), InvalidTypeError, r"write \['paged'\]"),
    ("simulate unknown allocator", lambda: simulate(W, 100, ["pagd"]), InvalidArgumentError,
     r"'pagd'.*orca-oracle"),
    ("simulate a number as allocator", lambda: simulate(W, 100, [3]), InvalidArgumentError, r"allocator 3"),
    ("simulate no block size", lambda: simulate(W, 100, ["paged"], []), InvalidArgumentError,
     r"at least 1 value, got an empty list"),
    ("simulate a zero block size in a sweep", lambda: simulate(W, 100, ["paged"], [16, 0]),
     InvalidArgumentError, r"block_size must be >= 1, got 0"),
    ("simulate text block size", lambda: simulate(W, 100, ["paged"], "16"), InvalidTypeError,
     r"block_size must be an int or a list of ints, got '16'"),
    ("simulate bool capacity", lambda: simulate(W, True), InvalidTypeError, r"capacity_tokens must be an int, got bool"),
    ("simulate unknown fit", lambda: simulate(W, 100, fit="tight"), InvalidArgumentError,
     r"fit must be one of .*got 'tight'"),
    ("simulate block past capacity", lambda: simulate(W, 8, ["orca-max", "paged"], 16), InvalidArgumentError,
     r"block_size 16 is larger than the capacity of 8"),
    ("run_schedule request too long", lambda: run_schedule(W, make_memory("orca-oracle", 6)),
     InvalidArgumentError, r"request 0 \(3 \+ 4 tokens\) needs \d+ slots under orca-oracle, more than the 6 usable"),
    ("reservation unknown kind", lambda: reservation_size("orca-min", 1, 1, 8), InvalidArgumentError,
     r"'orca-min'.*orca-pow2"),
    ("reservation bool length", lambda: reservation_size("orca-max", True, 1, 8), InvalidTypeError,
     r"prompt_len must be an int, got bool"),
    ("contiguous no capacity", lambda: ContiguousAllocator(0), InvalidArgumentError, r"capacity must be >= 1, got 0"),
    ("contiguous unknown policy", lambda: ContiguousAllocator(10, "worst-fit"), InvalidArgumentError,
     r"policy must be one of .*first-fit.*got 'worst-fit'"),
    ("contiguous empty request", lambda: ContiguousAllocator(10).try_allocate(0), InvalidArgumentError,
     r"size must be >= 1, got 0"),
    ("buddy float request", lambda: BuddyAllocator(16).try_allocate(1.5), InvalidTypeError,
     r"size must be an int, got float 1.5"),
]


@pytest.mark.parametrize("name, call, error, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_a_typed_error_naming_value_and_limit(name, call, error, pattern):
    with pytest.raises(error, match=pattern) as caught:
        call()
    assert isinstance(caught.value, PagedKVError)
    builtin = TypeError if issubclass(error, InvalidTypeError) else ValueError
    assert isinstance(caught.value, builtin), f"{name}: {type(caught.value).__name__} is not a {builtin.__name__}"


def test_trace_files_that_cannot_be_read(tmp_path):
    cases = {
        "lengths.txt": (b"prompt_len,output_len\n3,4\n", r"must end in .csv or .json, got '.txt'"),
        "broken.json": (b"[[3, 4],", r"is not valid JSON"),
        "object.json": (b'{"prompt_len": 3}', r"expected a JSON list of requests, got dict"),
        "zero.csv": (b"prompt_len,output_len\n3,0\n", r"row .*output_len must be an integer >= 1, got '0'"),
        "empty.csv": (b"prompt_len,output_len\n", r"holds no requests"),
        "latin1.csv": (b"prompt_len,output_len\n\xff,3\n", r"is not UTF-8 text: byte 0xff at position 22"),
        "header.csv": (b"a,b\n1,2\n", r"missing \['output_len', 'prompt_len'\], found \['a', 'b'\]"),
    }
    for name, (content, pattern) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(WorkloadError, match=pattern):
            load_workload(path)
        assert path.read_bytes() == content  # a refused trace is left as it was


def test_a_refused_free_changes_nothing():
    for pool in (ContiguousAllocator(32), BuddyAllocator(32)):
        start = pool.try_allocate(5)
        before = (pool.holes, pool.allocations, pool.num_free, pool.num_used, pool.largest_hole)
        with pytest.raises(InvalidArgumentError, match=rf"no allocated .* starts at 3 .*allocated starts: \[{start}\]"):
            pool.free(3)
        assert (pool.holes, pool.allocations, pool.num_free, pool.num_used, pool.largest_hole) == before
        pool.check_invariants()
        assert pool.free(start) >= 5


def run_cli(*argv):
    parser = argparse.ArgumentParser(prog="paged-kv")
    sim_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


CLI_CASES = [
    (("--block-size", "16,x"), r"--block-size takes integers separated by commas, got '16,x'"),
    (("--block-size", "0"), r"block_size must be >= 1, got 0"),
    (("--allocators", ","), r"--allocators names no allocator; choose from orca-max"),
    (("--allocators", "paged,lru"), r"'lru'.*orca-max"),
    (("--capacity-tokens", "0"), r"capacity_tokens must be >= 1, got 0"),
    (("--requests", "0"), r"num_requests must be >= 1, got 0"),
    (("--rate", "-1"), r"rate must be a finite number > 0, got -1"),
    (("--max-len", "1"), r"max_len must be >= 2, got 1"),
    (("--workload", "gpt4"), r"'gpt4' is neither sharegpt nor alpaca nor a file"),
    (("--plot", "figure.txt"), r"--plot figure.txt: give a file ending in .png"),
    (("--plot", os.path.join("no", "such", "folder", "f.png")), r"no folder"),
]


@pytest.mark.parametrize("argv, pattern", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_the_cli_refuses_bad_arguments_with_status_2_and_a_message(argv, pattern, capsys, tmp_path, monkeypatch):
    import re

    monkeypatch.chdir(tmp_path)
    assert run_cli("--requests", "20", "--no-progress", *argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no table: nothing ran
    assert captured.err.startswith("paged-kv simulate: error: ")
    assert re.search(pattern, captured.err), captured.err
    assert list(tmp_path.iterdir()) == []  # and nothing was written
