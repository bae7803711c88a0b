"""The per-exercise view of the library (interfaces.md item 1): forbidden modules are stubs in the kernel.

A tiny FORBIDDEN is set here (exercise authors set the real lists on their branches). Each
view is checked in a fresh interpreter: the staged copy the sandbox shows, and the import
hook of ``--sandbox none``. Importing still works; any use raises the one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paged_kv_course.grading import sandbox, stubs
from paged_kv_course.grading.sandbox import package_folders

FORBIDDEN = ("paged_kv_lib.allocator", "paged_kv_course.grading")
LINE = "paged_kv_lib.allocator is not available while exercise 03 is graded: it implements what the exercise grades"

PROBE = r'''
import json, sys
out = {}
import paged_kv_lib                                   # the package and allowed modules still import
from paged_kv_lib.errors import PagedKVError
from paged_kv_lib.allocator import PagedKVCacheAllocator     # importing a name works
import paged_kv_course.grading.checks_03 as cases        # so does a submodule of a stubbed package

def attempt(name, action):
    try:
        action()
        out[name] = "allowed"
    except ImportError as exc:
        out[name] = f"{type(exc).__name__}: {exc}"

attempt("call", lambda: PagedKVCacheAllocator(4, 4))
attempt("attribute", lambda: PagedKVCacheAllocator.allocate)
attempt("subclass", lambda: type("Mine", (PagedKVCacheAllocator,), {}))
attempt("isinstance", lambda: isinstance(3, PagedKVCacheAllocator))
attempt("case data", lambda: list(cases.MiniPool.__dict__))
attempt("cases call", lambda: cases.check_my_fork(None))
attempt("errors", lambda: PagedKVError("fine"))
out["repr"] = repr(PagedKVCacheAllocator)
print(json.dumps(out))
'''


def _run(argv, env, cwd: Path) -> dict:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _expect(out: dict) -> None:
    for use in ("call", "attribute", "subclass", "isinstance"):
        assert out[use] == f"{stubs.ERROR_NAME}: {LINE}", (use, out[use])
    assert out["case data"].startswith(stubs.ERROR_NAME) and "paged_kv_course.grading" in out["case data"]
    assert out["errors"] == "allowed"
    assert "not available" in out["repr"]


def test_the_staged_copy_holds_stubs_for_the_forbidden_modules_only(tmp_path):
    package, course = package_folders()
    stubbed = stubs.stage_library(package, tmp_path, FORBIDDEN, "03") + stubs.stage_library(course, tmp_path, FORBIDDEN, "03")
    assert "paged_kv_lib.allocator" in stubbed and "paged_kv_course.grading.checks_03" in stubbed
    assert "paged_kv_lib.errors" not in stubbed
    copy = tmp_path / "paged_kv_lib"
    assert (copy / "errors.py").read_text() == (package / "errors.py").read_text()
    checks = tmp_path / "paged_kv_course" / "grading" / "checks_03.py"
    assert "check_my_fork" not in checks.read_text()  # no answer key in the copy
    assert not list(tmp_path.rglob("__pycache__"))
    env = dict(PYTHONPATH=str(tmp_path), PATH="/usr/bin:/bin", TRITON_INTERPRET="1")
    (tmp_path / "work").mkdir()
    _expect(_run([sys.executable, "-s", "-c", PROBE], env, tmp_path / "work"))


def test_without_the_sandbox_an_import_hook_gives_the_same_stubs(tmp_path):
    hook = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('s', {stubs.__file__!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            f"m.install_hook({list(FORBIDDEN)!r}, '03')\n")
    _expect(_run([sys.executable, "-c", hook + PROBE], dict(PATH="/usr/bin:/bin", TRITON_INTERPRET="1"), tmp_path))


def test_no_forbidden_modules_means_the_real_library(tmp_path):
    assert all(stubs.stage_library(package, tmp_path, (), "02") == () for package in package_folders())


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(sandbox.bwrap_problem()), reason=f"no sandbox: {sandbox.bwrap_problem()}")
def test_in_the_sandbox_a_solution_cell_that_uses_a_forbidden_module_fails_with_the_line(tmp_path):
    from paged_kv_course.grading import judge

    cells = [{"source": "from paged_kv_lib.allocator import PagedKVCacheAllocator\nPagedKVCacheAllocator(4, 4)",
              "tags": [], "task": "03.1", "role": "solution"}]
    for mode in ("bwrap", "none"):
        result = judge.judge({"cells": cells, "timeout": 60, "workdir": str(tmp_path / mode), "resolved_mode": mode,
                              "exercise": "03", "forbidden": list(FORBIDDEN)})
        assert result["results"][0]["outcome"] == "failed"
        assert result["results"][0]["line"] == LINE, (mode, result["results"][0])
