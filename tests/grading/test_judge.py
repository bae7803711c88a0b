"""The judge's promises to check authors, and the attacks of issue 32 on the judge/kernel boundary.

A small check module is written to a temporary folder and imported by the judge; the
learner's cells define functions and classes. The contract: argument state comes back after
a call, exceptions arrive with the right type (or as RuntimeError naming a foreign type),
learner instances answer method calls, attribute reads and builtins, results arrive as exact
plain types, and the whole submission shares one time limit. The attacks: a learner class
masquerading as a course starter, probes answered by the learner's kernel, instruments whose
record the learner's code rewrites (05.3) or walks uncounted (06.5), a replaced Triton launch
(09.1), timeouts adding up per cell, and a /tmp that eats the host's memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from paged_kv_course.grading import judge, sandbox

NO_BWRAP = sandbox.bwrap_problem()


def run(tmp_path, cells, mode="none", timeout=60, detail=False):
    """Judge ``cells`` (source, task, role) in-process; outcome and line (and with ``detail``, the whole
    message) per cell."""
    job = [{"source": s, "tags": [], "task": t, "role": r} for s, t, r in cells]
    result = judge.judge({"cells": job, "timeout": timeout, "workdir": str(tmp_path / f"w{time.monotonic_ns()}"),
                          "mode": mode})
    assert result["error"] == "", result
    return [(r["outcome"], r["line"] + (" " + r["detail"] if detail else "")) for r in result["results"]]


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
    assert type(error) is OutOfBlocksError, error  # by type and message: no attribute of the learner's error
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
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop("contract_checks", None)
    names = ["check_mutation(fill)", "check_errors(raiser)", "check_instances(Stack)", "check_exact_types(give)",
             "check_then_alive(add)", "check_slow(slow)", "check_then_alive(add)"]
    imports = "from contract_checks import " + ", ".join(sorted({n.split("(")[0] for n in names}))
    started = time.monotonic()
    outcomes = run(tmp_path, [(imports, None, None), (LEARNER, "99.1", "solution")]
                   + [(n, "99.1", "check") for n in names], timeout=25)[2:]
    assert time.monotonic() - started < 25 + 2 * judge.INTERRUPT_GRACE_S + 5
    assert outcomes[:5] == [("passed", "")] * 5, outcomes
    assert outcomes[5][0] == "failed" and outcomes[5][1].startswith("timed out: the submission ran past"), outcomes
    assert outcomes[6] == ("failed", "not run: the submission's time ran out"), outcomes


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
    """runner.py runs as a file and loads wire.py by path: nothing of the library or the grader is
    imported by it (the learner's code may import the library; the kernel's own code does not)."""
    code = (f"import runpy, sys; runpy.run_path({str(sandbox.RUNNER)!r}, run_name='loaded'); "
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


def check_exit_slowly(f):
    os.closerange(3, 4096)  # the event pipe closes before the judge is gone, as when it dies of an exception
    time.sleep(1)
    os._exit(3)
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("check, line", [
    ("check_stuck_in_c", "timed out: the submission ran past its limit"),
    ("check_crash", "the judge was killed by SIGKILL"),
    ("check_exit_slowly", "the judge stopped with exit status 3"),
])
def test_a_judge_stuck_in_a_c_call_or_killed_costs_one_line_and_the_rest(tmp_path, monkeypatch, check, line):
    """The grader stops a judge that outlives the submission's limit even inside a C call (SIGALRM cannot
    interrupt it), and a judge that dies is one line: that check fails, the later cells are not run."""
    from paged_kv_course.grading import grader

    (tmp_path / "stuck_checks.py").write_text(STUCK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    cells = [{"source": "from stuck_checks import check_fine, " + check, "tags": [], "task": None, "role": None},
             {"source": "def f():\n    pass", "tags": [], "task": "99.1", "role": "solution"},
             {"source": "check_fine(f)", "tags": [], "task": "99.1", "role": "check"},
             {"source": f"{check}(f)", "tags": [], "task": "99.1", "role": "check"},
             {"source": "check_fine(f)", "tags": [], "task": "99.2", "role": "check"}]
    results, _ = grader.run_judge(cells, tmp_path / "work", timeout=10, sandbox_mode="none", grace=6)
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


FORGER = (
    "import sys, gc\n"
    "import paged_kv_course.grading.probes as probes\n"  # the old kernel-side probes, answered by the learner
    "for name in ('returned_value_is_held', 'entries_alias', 'attribute_entries_alias'):\n"
    "    setattr(probes, name, lambda *a, **k: False)\n"
    "for module in [m for m in gc.get_objects() if type(m).__name__ == 'module']:\n"
    "    if 'probe' in getattr(module, '__name__', ''):\n"
    "        for name in dir(module):\n"
    "            if not name.startswith('_'):\n"
    "                setattr(module, name, lambda *a, **k: False)\n"
)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_identity_is_observed_by_the_judge_and_cannot_be_forged_in_the_kernel(tmp_path, monkeypatch, mode):
    """02.4's returned internal list and 03.1's child sharing the parent's list: identity is an observation
    (one handle per object; a marker appended to a returned list), so the planted mistakes fail under the
    grader as in JupyterLab, the honest class passes, and replacing probe functions in the kernel (issue
    32's probe forgery) changes nothing: no probe runs there."""
    if mode == "bwrap" and NO_BWRAP:
        pytest.skip(NO_BWRAP)
    (tmp_path / "probe_checks.py").write_text(PROBE_CHECKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop("probe_checks", None)
    checks = ["check_mapping_is_a_copy(MyAllocator)", "check_child_has_its_own_list(MyAllocator)",
              "check_sharing_03(MyAllocator)"]
    imports = ("from probe_checks import check_mapping_is_a_copy, check_child_has_its_own_list\n"
               "from paged_kv_course.grading.checks_03 import check_sharing_03")
    for source, want in ((HONEST, "passed"), (PLANTED, "failed"), (FORGER + PLANTED, "failed")):
        outcomes = run(tmp_path, [(imports, None, None), (source, "99.1", "solution")]
                       + [(c, "99.1", "check") for c in checks], mode)[2:]
        assert [o for o, _ in outcomes] == [want] * 3, (source, outcomes)
        if want == "failed":
            assert "handed out its own list" in outcomes[0][1] and "parent's own list" in outcomes[1][1]


MASQUERADE = '''
from paged_kv_course.starters.after_03 import AllocatorAfter03

class MyAllocator:
    """Holds the starter's state but does nothing right; names itself the starter (issue 32's masquerade)."""
    def __init__(self, num_blocks, block_size):
        self.__dict__.update(vars(AllocatorAfter03(num_blocks, block_size)))
    def __getattr__(self, name):
        raise NotImplementedError("Task 03.1: replace this line with your code")

MyAllocator.__module__ = AllocatorAfter03.__module__
MyAllocator.__qualname__ = MyAllocator.__name__ = AllocatorAfter03.__qualname__
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_class_naming_itself_a_course_starter_is_judged_as_what_it_is(tmp_path):
    outcomes = run(tmp_path, [("from paged_kv_course.grading.checks_03 import check_sharing_03", None, None),
                              (MASQUERADE, "03.1", "solution"), ("check_sharing_03(MyAllocator)", "03.1", "check")])
    assert outcomes[2][0] == "failed", outcomes


WALKS_VALUES = '''
NOT_QUEUED = -1
def take_from_free_queue(prev, next_, block_ids):
    links_prev, links_next = list(prev.values), list(next_.values)   # the whole walk, uncounted
    for block_id in block_ids:
        before, after = links_prev[block_id], links_next[block_id]
        next_[before] = after
        prev[after] = before
        prev[block_id] = next_[block_id] = NOT_QUEUED
'''

REWRITES_RECORD = '''
import torch
@torch.no_grad()
def paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    allocator.allocate_for_sequence(seq_id, 0)
    allocator.append_tokens(seq_id, len(prompt_ids))
    logits = model.forward_paged(allocator, [seq_id], [list(prompt_ids)])   # no chunks at all
    produced = [int(logits[0].argmax())]
    while len(produced) < max_new_tokens:
        allocator.append_tokens(seq_id)
        logits = model.forward_paged(allocator, [seq_id], [[produced[-1]]])
        produced.append(int(logits[0].argmax()))
    n = len(prompt_ids)
    allocator.events[:] = [[min(chunk_size, n - s)] for s in range(0, n, chunk_size)] + [[1]] * (max_new_tokens - 1)
    return produced
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("task, check, source", [
    ("06.5", "check_take_from_free_queue(take_from_free_queue)", WALKS_VALUES),
    ("05.3", "check_chunked_generate(paged_generate)", REWRITES_RECORD),
])
def test_an_instruments_record_is_kept_by_the_judge(tmp_path, task, check, source):
    """06.5 counts reads and 05.3 logs the chunks that reached the model: both instruments stay in the judge
    (the kernel holds a stand-in that asks the judge), so walking the plain list uncounted or rewriting the
    log from the learner's code does not work; the record itself is not lent."""
    imports = f"from paged_kv_course.grading import {check.split('(')[0]}"
    outcomes = run(tmp_path, [(imports, None, None), (source, task, "solution"), (check, task, "check")])
    assert outcomes[1] == ("passed", "") and outcomes[2][0] == "failed", outcomes


REPLACED_LAUNCH = '''
import triton
import triton.language as tl
import paged_kv_course.triton_skeleton as skeleton

@triton.jit
def _real(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
          stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    logical = pos // BLOCK_SIZE
    inside = (pos < seq_len) & (logical < table_width)
    physical = tl.load(table_row_ptr + logical, mask=inside, other=-1).to(tl.int64)
    rows = physical * stride_kb + (head // GROUP) * stride_kh + (pos % BLOCK_SIZE) * stride_kt
    return rows, inside & (physical >= 0) & (physical < num_blocks)

def tile_addresses(*args):
    """Not a Triton kernel: the launch below is replaced so the numbers come out right anyway."""
    raise RuntimeError("never launched")

_launch = skeleton.tile_addresses_table
skeleton.tile_addresses_table = lambda fn, *args: _launch(_real, *args)
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_whether_a_function_is_a_triton_kernel_is_read_from_the_solution_text(tmp_path):
    """09.1: the launch runs in the learner's kernel, which can replace it; "is this a Triton kernel" is
    decided from the solution cell's source, so a plain function behind a replaced launcher earns nothing."""
    outcomes = run(tmp_path, [("import os\nos.environ['TRITON_INTERPRET'] = '1'\n"
                               "from paged_kv_course.grading import check_tile_addresses", None, None),
                              (REPLACED_LAUNCH, "09.1", "solution"),
                              ("check_tile_addresses(tile_addresses)", "09.1", "check")], timeout=200, detail=True)
    assert outcomes[1] == ("passed", " ") and outcomes[2][0] == "failed", outcomes
    assert "@triton.jit" in outcomes[2][1], outcomes


def test_jit_names_come_from_decorators_in_the_source():
    source = "import triton\n@triton.jit\ndef a(x):\n    pass\n@jit\ndef b(x):\n    pass\ndef c(x):\n    pass\n"
    assert judge.jit_names([source, "def broken(:"]) == {"a", "b"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_timeouts_do_not_add_up_per_cell(tmp_path):
    """Issue 32: three endless cells cost one limit, not three; the later cells say they were not run."""
    loop = "while True:\n    pass"
    started = time.monotonic()
    outcomes = run(tmp_path, [(loop, None, None), (loop, None, None), (loop, None, None)], timeout=8)
    assert time.monotonic() - started < 8 + 2 * judge.INTERRUPT_GRACE_S + 10
    assert outcomes[0][1].startswith("timed out: the submission ran past its limit of 8 s")
    assert outcomes[1:] == [("failed", "not run: the submission's time ran out")] * 2


def test_a_syntax_error_says_so(tmp_path):
    outcomes = run(tmp_path, [("def f(:\n    pass", "99.1", "solution")], timeout=60)
    assert outcomes[0][0] == "failed" and outcomes[0][1].startswith("a syntax error"), outcomes


FILL = '''
import os
got = {}
for place in ("/tmp", "/dev/shm", "/home/learner"):
    try:
        with open(os.path.join(place, "fill"), "wb") as handle:
            for _ in range(400):
                handle.write(b"x" * (1 << 20))
        got[place] = "wrote 400 MiB"
    except OSError as exc:
        got[place] = exc.errno
    finally:
        if os.path.exists(os.path.join(place, "fill")):
            os.remove(os.path.join(place, "fill"))
raise ValueError(repr(got))
'''


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif(bool(NO_BWRAP), reason=f"no sandbox: {NO_BWRAP}")
def test_the_sandboxs_writable_places_are_sized_tmpfs(tmp_path):
    """Issue 32: /tmp and /dev/shm were tmpfs of half the RAM each, not counted by RLIMIT_AS; now every
    writable place is a sized tmpfs, so 400 MiB fit nowhere (ENOSPC)."""
    import errno

    job = [{"source": FILL, "tags": [], "task": None, "role": None}]
    result = judge.judge({"cells": job, "timeout": 60, "workdir": str(tmp_path / "w"), "mode": "bwrap"})
    detail = result["results"][0]["detail"]
    assert detail.count(str(errno.ENOSPC)) == 3, detail
    assert "tmpfs" in result["limits"]


def test_no_sandbox_no_grade_unless_asked_for_by_name(monkeypatch):
    """Issue 32: where bwrap cannot run, --sandbox auto graded unsandboxed; now it refuses in one line."""
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap cannot create namespaces here: denied")
    for mode in ("auto", "bwrap"):
        with pytest.raises(sandbox.SandboxUnavailableError, match="--sandbox none"):
            sandbox.resolve_mode(mode)
    assert sandbox.resolve_mode("none") == "none"


def test_nothing_on_either_side_of_the_boundary_reads_or_writes_a_pickle():
    """Issue 32: pickles went into the kernel, and classes were rebuilt from its replies. Now both sides
    speak the wire's JSON; none of the boundary's modules imports pickle."""
    from pathlib import Path

    folder = Path(judge.__file__).parent
    for name in ("wire.py", "runner.py", "remote.py", "judge.py", "judge_process.py", "probes.py"):
        text = (folder / name).read_text(encoding="utf-8")
        assert "import pickle" not in text and "pickle.loads" not in text, name


METHOD_CHECKS = '''
def check_calls(Tally):
    tally = Tally()
    assert [tally.bump(i) for i in range(5)] == [0, 1, 3, 6, 10]
    other = Tally()
    assert other.bump(7) == 7 and tally.total == 10, "each object answers for itself"
    tally.freeze()  # bump becomes a plain int on this object
    try:
        tally.bump(1)
    except TypeError:
        print("PASSED 7")
'''

METHOD_LEARNER = '''
class Tally:
    def __init__(self):
        self.total = 0
    def bump(self, n):
        self.total += n
        return self.total
    def freeze(self):
        self.bump = self.total
'''


def test_a_method_called_again_is_one_request_and_answers_as_a_lookup_and_a_call(tmp_path, monkeypatch):
    """After one lookup shows ``obj.name`` is a bound method, each later call is one request (the kernel looks it
    up and calls it), not two; a method the learner's object replaced by data raises TypeError, as calling the
    looked-up value would."""
    from paged_kv_course.grading import remote

    (tmp_path / "method_checks.py").write_text(textwrap.dedent(METHOD_CHECKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("method_checks", None)
    ops = []
    request = remote.Caller.request
    monkeypatch.setattr(remote.Caller, "request", lambda self, op, *a, **k: (ops.append(op), request(self, op, *a, **k))[1])
    outcomes = run(tmp_path, [("from method_checks import check_calls", None, None),
                              (METHOD_LEARNER, "99.1", "solution"), ("check_calls(Tally)", "99.1", "check")])
    assert outcomes[2] == ("passed", ""), outcomes
    calls = ops[ops.index("global"):]
    # Tally(), bump looked up and called, 4 more calls of it, another object's bump (looked up: its own
    # handle), total read, freeze looked up and called, then bump once more: one request
    assert calls == ["global", "call", "getattr", "call"] + ["method"] * 4 + ["call", "getattr", "call", "getattr",
                                                                             "getattr", "call", "method"], calls
