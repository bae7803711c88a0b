"""The judge's promises to check authors (CHECKS_CONTRACT.md), on a kernel of its own.

A small check module is written to a temporary folder and imported by the judge; the
learner's cells define functions and classes. Each promise is one check that passes only
if the judge keeps it: argument state comes back after a call, exceptions arrive with the
right type (or as RuntimeError naming a foreign type), learner instances answer method
calls, attribute reads and builtins, results arrive as exact plain types, and a check that
outlives its time limit fails without stopping the notebook.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from paged_kv_course.grading import judge

CHECKS = '''
import torch
from paged_kv_lib.errors import OutOfBlocksError, PagedKVError
from paged_kv_course.grading._common import call_learner, expect_raises, fail, same


def check_mutation(fill):
    values = [1, 2]
    cache = torch.zeros(2, 3)
    got = fill(values, cache)
    assert got is None, got
    assert values == [1, 2, 99], values
    assert torch.equal(cache, torch.tensor([[0.0, 0, 0], [7, 7, 7]])), cache
    print("PASSED 1")


def check_errors(raiser):
    error = expect_raises(raiser, ("value",), "raiser('value')", ValueError, "")
    assert type(error) is ValueError and str(error) == "bad value", error
    error = expect_raises(raiser, ("pool",), "raiser('pool')", OutOfBlocksError, "")
    assert type(error) is OutOfBlocksError and error.needed == 3 and error.free == 1, vars(error)
    error = expect_raises(raiser, ("own",), "raiser('own')", RuntimeError, "")
    assert type(error) is RuntimeError and str(error).startswith("MyError"), error
    print("PASSED 2")


def check_instances(Stack):
    stack = Stack()
    stack.push(3)
    stack.push(4)
    assert len(stack) == 2 and list(stack) == [3, 4] and 4 in stack and bool(stack)
    assert stack.items == [3, 4] and stack[1] == 4 and stack.top == 4
    assert "Stack" in repr(stack)
    popped = stack.pop()
    assert type(popped) is int and popped == 4
    print("PASSED 3")


def check_exact_types(give):
    got = give()
    assert same({"a": [1, (2.5, "x")], "b": torch.arange(3, dtype=torch.int16)}, got), got
    assert type(got["b"]) is torch.Tensor and got["b"].dtype is torch.int16
    sneaky = give(True)
    assert type(sneaky) is not int and sneaky != 3 and not (sneaky == 3)
    print("PASSED 4")


def check_slow(slow):
    call_learner(slow, (), "slow()", None)
    print("PASSED 5")


def check_then_alive(add):
    assert add(2, 3) == 5
    print("PASSED 6")
'''

LEARNER = '''
import torch

def fill(values, cache):
    values.append(99)
    cache[1] = 7

class MyError(ValueError):
    pass

def raiser(kind):
    from paged_kv_lib.errors import OutOfBlocksError
    if kind == "value":
        raise ValueError("bad value")
    if kind == "pool":
        raise OutOfBlocksError(3, 1, "grow")
    raise MyError("mine")

class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        return self.items.pop()
    @property
    def top(self):
        return self.items[-1]
    def __len__(self):
        return len(self.items)
    def __iter__(self):
        return iter(self.items)
    def __getitem__(self, i):
        return self.items[i]
    def __repr__(self):
        return f"Stack({self.items})"

class Anything(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = int.__hash__

def give(sneaky=False):
    if sneaky:
        return Anything(3)
    return {"a": [1, (2.5, "x")], "b": torch.arange(3, dtype=torch.int16)}

def slow():
    while True:
        pass

def add(a, b):
    return a + b
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_judge_keeps_the_check_contract(tmp_path, monkeypatch):
    (tmp_path / "contract_checks.py").write_text(textwrap.dedent(CHECKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    sys.modules.pop("contract_checks", None)
    names = ["check_mutation(fill)", "check_errors(raiser)", "check_instances(Stack)", "check_exact_types(give)",
             "check_slow(slow)", "check_then_alive(add)"]
    imports = "from contract_checks import " + ", ".join(n.split("(")[0] for n in names)
    cells = [{"source": imports, "tags": [], "task": None, "role": None},
             {"source": LEARNER, "tags": [], "task": "99.1", "role": "solution"}]
    cells += [{"source": n, "tags": [], "task": "99.1", "role": "check"} for n in names]
    result = judge.judge({"cells": cells, "timeout": 15, "workdir": str(tmp_path / "work"), "resolved_mode": "none"})
    assert result["error"] == ""
    outcomes = {cells[r["index"]]["source"]: (r["outcome"], r["line"]) for r in result["results"]}
    for name in names:
        if name == "check_slow(slow)":
            assert outcomes[name][0] == "failed" and outcomes[name][1].startswith("timed out"), outcomes[name]
        else:
            assert outcomes[name] == ("passed", ""), (name, outcomes[name])


def test_check_cells_are_one_call_with_names_or_literals():
    known = {"check_a": ("m", "check_a")}
    call = judge.parse_check_cell("from m import check_a\ncheck_a(f, 3, name='x', sizes=[1, 2])", {})
    assert call == judge.CheckCall("m", "check_a", (("name", "f"), ("value", 3)),
                                   (("name", ("value", "x")), ("sizes", ("value", [1, 2]))))
    for bad in ["check_a(f)\ncheck_a(g)", "x = check_a(f)", "check_a(f())", "check_b(f)", "check_a(*fs)",
                "import os\nos.system('x')", "check_a(f"]:
        with pytest.raises(judge.CheckCellError):
            judge.parse_check_cell(bad, known)


def test_the_kernel_side_imports_nothing_of_the_library():
    """runner.py runs as a file and loads its helpers by path: the grading package (stubbed in the
    kernel) and the rest of the library are never imported by it."""
    code = (f"import runpy, sys; runpy.run_path({str(judge.RUNNER)!r}, run_name='loaded'); "
            "print(sorted(m for m in sys.modules if m.startswith('paged_kv_lib')))")
    done = subprocess.run([sys.executable, "-s", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


STUCK = '''
import os, signal, time


def check_fine(f):
    print("PASSED")


def check_stuck_in_c(f):
    # A call that never returns to the interpreter, so SIGALRM cannot reach it (blocked here to make it so).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


def check_crash(f):
    os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("check, line", [
    ("check_stuck_in_c", "timed out: the grader stopped the judge"),
    ("check_crash", "the judge was killed by SIGKILL"),
])
def test_a_judge_stuck_in_a_c_call_or_killed_costs_one_line_and_the_rest(tmp_path, monkeypatch, check, line):
    """The grader stops a judge whose check outlives its limit even inside a C call (SIGALRM cannot
    interrupt it), and a judge that dies is one line: that check fails, the later cells are not run."""
    from paged_kv_course.grading import grader

    (tmp_path / "stuck_checks.py").write_text(STUCK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cells = [{"source": "from stuck_checks import check_fine, " + check, "tags": [], "task": None, "role": None},
             {"source": "def f():\n    pass", "tags": [], "task": "99.1", "role": "solution"},
             {"source": "check_fine(f)", "tags": [], "task": "99.1", "role": "check"},
             {"source": f"{check}(f)", "tags": [], "task": "99.1", "role": "check"},
             {"source": "check_fine(f)", "tags": [], "task": "99.2", "role": "check"}]
    results, _ = grader.run_judge(cells, tmp_path / "work", cell_timeout=2, sandbox_mode="none")
    assert results[2]["outcome"] == "passed", results[2]
    assert results[3]["outcome"] == "failed" and results[3]["line"].startswith(line), results[3]
    assert "\n" not in results[3]["line"] and results[3]["detail"] == ""
    assert results[4]["outcome"] == "failed" and results[4]["line"].startswith("not run: the judge was stopped")


PROBE_CHECKS = '''
from paged_kv_course.grading._common import run_probe
from paged_kv_course.grading.probes import entries_alias, returned_value_is_held


def check_mapping_is_a_copy(MyAllocator):
    a = MyAllocator(8, 4)
    a.allocate_for_sequence(0, 10)
    assert not run_probe(returned_value_is_held, a, "get_block_mapping", (0,)), "get_block_mapping handed out its own list"
    print("PASSED 1")


def check_child_has_its_own_list(MyAllocator):
    a = MyAllocator(8, 4)
    a.allocate_for_sequence(0, 10)
    a.fork(0, 1)
    assert not run_probe(entries_alias, a.tables, 0, 1), "the child got the parent's own list"
    print("PASSED 2")
'''

HONEST = "from paged_kv_course.starters.after_03 import AllocatorAfter03 as MyAllocator\n"
PLANTED = HONEST.replace(" as MyAllocator", "") + (
    "class MyAllocator(AllocatorAfter03):\n"
    "    def get_block_mapping(self, seq_id):\n"
    "        super().get_block_mapping(seq_id)\n"
    "        return self.tables[seq_id]\n"
    "    def fork(self, parent, child):\n"
    "        super().fork(parent, child)\n"
    "        self.tables[child] = self.tables[parent]\n"
)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_identity_checks_fire_under_the_judge_as_in_a_notebook(tmp_path, monkeypatch, mode):
    """02.4's returned internal list and 03.1's child sharing the parent's list: run_probe runs the
    probe where the objects live (a handle) and aliasing inside one reply survives the wire, so the
    planted mistakes fail under the grader as they do in JupyterLab, and the honest class passes."""
    from paged_kv_course.grading import checks_03, sandbox

    if mode == "bwrap" and sandbox.bwrap_problem():
        pytest.skip(sandbox.bwrap_problem())
    (tmp_path / "probe_checks.py").write_text(PROBE_CHECKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    sys.modules.pop("probe_checks", None)
    checks = ["check_mapping_is_a_copy(MyAllocator)", "check_child_has_its_own_list(MyAllocator)",
              "check_sharing_03(MyAllocator)"]
    for source, want in ((HONEST, "passed"), (PLANTED, "failed")):
        cells = [{"source": "from probe_checks import check_mapping_is_a_copy, check_child_has_its_own_list\n"
                            "from paged_kv_course.grading.checks_03 import check_sharing_03", "tags": [], "task": None,
                  "role": None},
                 {"source": source, "tags": [], "task": "99.1", "role": "solution"}]
        cells += [{"source": c, "tags": [], "task": "99.1", "role": "check"} for c in checks]
        result = judge.judge({"cells": cells, "timeout": 60, "workdir": str(tmp_path / mode / want),
                              "resolved_mode": mode})
        assert result["error"] == "", result
        outcomes = [(r["outcome"], r["line"]) for r in result["results"][2:]]
        assert [o for o, _ in outcomes] == [want] * 3, (source, outcomes)
        if want == "failed":
            assert "handed out its own list" in outcomes[0][1] and "parent's own list" in outcomes[1][1]
    assert hasattr(checks_03, "check_sharing_03")
