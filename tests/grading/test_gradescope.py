"""The Gradescope autograder: the zip's contents, and run_autograder in a stand-in /autograder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from paged_kv_lib import cli
from paged_kv_course.grading import gradescope
from paged_kv_course.grading.notebook_tasks import split_points

from test_release import FIXTURES, POINTS, demo_course, solved


@pytest.fixture(autouse=True)
def _demo_checks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))


def autograder_root(tmp_path: Path, course: Path, exercise=None) -> Path:
    """What Gradescope lays out: the zip unpacked in source/, a submission/ folder, a results/ folder."""
    zipped = gradescope.build_autograder(course, tmp_path / "autograder.zip", exercise)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zipped) as archive:
        archive.extractall(root / "source")
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in archive.infolist()}
    assert modes["run_autograder"] == 0o755 and modes["setup.sh"] == 0o755
    for name in ("run_autograder", "setup.sh"):
        os.chmod(root / "source" / name, 0o755)  # extractall drops modes; Gradescope keeps them
    (root / "submission").mkdir()
    return root


def run_autograder(root: Path) -> dict:
    env = dict(os.environ, GRADESCOPE_ROOT=str(root), PAGED_KV_PYTHON=sys.executable)
    done = subprocess.run([str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))


def test_the_zip_holds_setup_run_autograder_and_the_course_with_solutions(tmp_path):
    course = demo_course(tmp_path / "course")
    zipped = gradescope.build_autograder(course, tmp_path / "a.zip", "90")
    names = set(zipfile.ZipFile(zipped).namelist())
    assert {"setup.sh", "run_autograder", gradescope.CONFIG_NAME, "course/exercises/solutions/90_demo.ipynb"} <= names
    assert not any(n.startswith("course/tests/") for n in names)
    config = json.loads(zipfile.ZipFile(zipped).read(gradescope.CONFIG_NAME))
    assert config == {"exercise": "90_demo"}
    setup = zipfile.ZipFile(zipped).read("setup.sh").decode()
    assert "bubblewrap" in setup and "./course[triton]" in setup


@pytest.mark.slow
def test_run_autograder_writes_one_test_per_task_summing_to_the_score(tmp_path):
    course = demo_course(tmp_path / "course")
    root = autograder_root(tmp_path, course, "90_demo")
    notebook = solved(course / "exercises" / "90_demo.ipynb", root / "submission" / "90_demo.ipynb")
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:  # task 90.3 answered wrongly
        meta = cell.get("metadata", {}).get("paged_kv", {})
        if meta.get("task") == "90.3" and meta.get("role") == "solution":
            cell["source"] = "def blocks_needed(num_tokens, block_size):\n    return num_tokens // block_size\n"
    notebook.write_text(json.dumps(nb))
    results = run_autograder(root)
    tests = {t["name"]: t for t in results["tests"]}
    assert set(tests) == {f"task {t}" for t in POINTS}
    assert {t: tests[f"task {t}"]["max_score"] for t in POINTS} == POINTS
    zero_share = split_points(POINTS["90.3"], [None, None])[1]  # check_blocks_zero passes: partial credit
    assert tests["task 90.1"]["score"] == 2 and tests["task 90.3"]["score"] == zero_share
    assert "expected" in tests["task 90.3"]["output"], "the full feedback is the test's output"
    assert f"check_blocks_zero: {zero_share:g}/{zero_share:g} pass" in tests["task 90.3"]["output"], "each check's points are shown"
    assert results["score"] == sum(t["score"] for t in results["tests"]) == 3 + zero_share


def test_a_submission_without_the_notebook_gets_one_line_and_no_score(tmp_path):
    course = demo_course(tmp_path / "course")
    root = autograder_root(tmp_path, course, "90_demo")
    (root / "submission" / "notes.txt").write_text("I forgot the notebook")
    assert gradescope.main(["run", "--root", str(root)]) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"] == "the submission holds no notebook for exercise 90_demo (found: no notebook at all)"
    assert not list((root / "results").glob(".results.*"))


def test_bad_autograder_options_are_one_line_and_write_nothing(tmp_path, capsys):
    course = demo_course(tmp_path / "course")
    assert cli.main(["gradescope", "--out", str(tmp_path / "a.zip"), "--course", str(course), "--exercise", "77"]) == 2
    assert "--exercise '77': not one of the course's exercises (90_demo)" in capsys.readouterr().err
    assert cli.main(["gradescope", "--out", str(tmp_path / "a.tar"), "--course", str(course)]) == 2
    assert "is a .zip file" in capsys.readouterr().err
    shutil.rmtree(course / "exercises" / "solutions")
    assert cli.main(["gradescope", "--out", str(tmp_path / "a.zip"), "--course", str(course)]) == 2
    assert "no exercises/solutions/" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.zip")) and not list(tmp_path.glob(".a.zip*"))
