"""What the learner's kernel sees in the sandbox (issue 23): no capabilities, an unprivileged uid
even under root, Python and the library and course packages only (read-only), and a mount table that names no learner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from paged_kv_course.grading import judge, sandbox

LOOK = r'''
import json, os, sys
status = open("/proc/self/status").read()
info = {
    "cap_eff": [l.split()[1] for l in status.splitlines() if l.startswith("CapEff")][0],
    "uid_map": open("/proc/self/uid_map").read().split(),
    "uid": os.getuid(),
    "mounts": open("/proc/self/mountinfo").read(),
    "exists": {p: os.path.exists(p) for p in PATHS},
    "library": __import__("paged_kv_lib").__file__,
    "home": os.getcwd(),
}
raise ValueError("VIEW" + json.dumps(info))
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(sandbox.bwrap_problem()), reason=f"no sandbox: {sandbox.bwrap_problem()}")
def test_the_kernel_sees_no_capability_no_root_no_checkout_and_no_learner_name(tmp_path):
    checkout = sandbox.checkout_root()
    learner_folder = tmp_path / "class" / "alice_smith"
    learner_folder.mkdir(parents=True)
    bound = sandbox.python_paths()
    home = [str(p) for p in Path.home().iterdir() if not any(b == p or p in b.parents for b in bound)]
    paths = [str(checkout / ".git"), str(checkout / "tests"), str(checkout / "exercises" / "solutions"),
             str(learner_folder), *home[:20]]
    cells = [{"source": f"PATHS = {paths!r}\n" + LOOK, "tags": [], "task": None, "role": None}]
    result = judge.judge({"cells": cells, "timeout": 60, "workdir": str(tmp_path / "w" / "work"),
                          "mode": "bwrap", "hidden": [str(tmp_path / "class")]})
    detail = result["results"][0]["detail"]
    info = json.loads(detail[detail.index("VIEW") + 4:])
    assert info["cap_eff"] == "0000000000000000"
    assert info["uid"] == 65534
    inside, outside, count = info["uid_map"]
    assert inside == "65534" and count == "1"
    if os.geteuid() == 0:
        assert int(outside) >= sandbox.KERNEL_UID_BASE, info["uid_map"]  # root's kernel is a uid of its own
    assert not any(info["exists"].values()), info["exists"]
    assert info["library"].startswith(sandbox.INSIDE + "/lib/"), info["library"]
    assert info["home"] == sandbox.INSIDE_HOME
    assert "alice_smith" not in info["mounts"] and str(checkout / ".git") not in info["mounts"]
    assert "limits" in result and "memory" in result["limits"]


def test_another_copy_of_the_course_on_the_path_is_never_bound(tmp_path, monkeypatch):
    """An editable install's .pth puts a checkout's root on sys.path; where the library is imported from
    somewhere else (a copy, as the unprivileged-user test does), that root is not the checkout the view
    leaves out, and binding it would show the kernel .git, tests/ and the solutions."""
    other = tmp_path / "other-checkout"
    (other / "paged_kv_lib").mkdir(parents=True)
    (other / "exercises" / "solutions").mkdir(parents=True)
    plain = tmp_path / "checks"
    plain.mkdir()
    monkeypatch.syspath_prepend(str(other))
    monkeypatch.syspath_prepend(str(plain))
    paths = sandbox.python_paths()
    assert not any(p == other or other in p.parents for p in paths), paths
    assert plain in paths, "a plain folder on the path (the course's checks) is still bound"


def test_a_folder_that_holds_the_environment_is_not_bound_the_environment_is(tmp_path, monkeypatch):
    """A checkout whose .venv runs the grader, its root on sys.path through an editable install's .pth but
    holding no package here (the unprivileged-user test's view, where the checkout sits in a private folder):
    binding that root would expose the checkout, and a hidden folder above it would drop the environment
    with it (the kernel then had no Python: "execvp .venv/bin/python: No such file")."""
    holder = tmp_path / "checkout"
    venv = holder / ".venv"
    venv.mkdir(parents=True)
    monkeypatch.setattr(sandbox.sys, "prefix", str(venv))
    monkeypatch.syspath_prepend(str(holder))
    paths = sandbox.python_paths()
    assert holder not in paths, paths
    assert venv.resolve() in paths, paths
