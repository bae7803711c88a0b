"""A release opens every exercise without an error (issue 34, item 7): with ``--assignment 03`` the starters of
03 and later are withheld, and an untouched exercise that imports one names it in one line instead of raising
ModuleNotFoundError, then NameError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paged_kv_course.grading.release import build_release, withheld_line

ROOT = Path(__file__).resolve().parents[2]

RUN_CELLS = r"""
import json, sys, traceback
nb = json.load(open(sys.argv[1]))
errors = []
namespace = {"__name__": "__main__"}
for cell in nb["cells"]:
    if cell["cell_type"] != "code":
        continue
    try:
        exec(compile("".join(cell["source"]), "<cell>", "exec"), namespace)
    except BaseException as exc:  # an untouched task fails its checks; what kind of failure is what counts
        errors.append(type(exc).__name__)
print("ERRORS", json.dumps(errors))
"""


@pytest.fixture(scope="module")
def release_03(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "course"
    build_release(ROOT, out, assignment=3)
    return out


def test_withheld_starters_are_placeholders_that_hold_no_answer(release_03):
    starters = release_03 / "course" / "paged_kv_course" / "starters"
    assert "class AllocatorAfter02" in (starters / "after_02.py").read_text(encoding="utf-8")
    for number in ("03", "05", "06"):
        text = (starters / f"after_{number}.py").read_text(encoding="utf-8")
        assert withheld_line(number) in text
        assert "ref_counts" not in text and "take_blocks" not in text


@pytest.mark.parametrize("notebook, number", [("05_growing_on_demand.ipynb", "03"), ("06_sharing.ipynb", "05")])
def test_an_untouched_exercise_names_the_withheld_starter_in_one_line(release_03, notebook, number):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(release_03), str(release_03 / "course")]),
               MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", RUN_CELLS, str(release_03 / "exercises" / notebook)],
                          cwd=release_03 / "exercises", env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.rsplit("ERRORS ", 1)[1])
    assert not {"ModuleNotFoundError", "ImportError", "NameError"} & set(errors), errors
    assert done.stdout.count(withheld_line(number)) == 1
