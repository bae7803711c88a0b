"""The Gradescope autograder: the zip's contents, its results.json against Gradescope's documented format,
and the zip run as Gradescope runs it (setup.sh's install into a fresh venv, then run_autograder).

Gradescope's autograder specification, which the schema below follows field for field:
https://gradescope-autograders.readthedocs.io/en/latest/specs/ ("Output format", "Controlling Test Case
Visibility", "Test case status", "Output String Formatting").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest

from paged_kv_lib import cli
from paged_kv_course.grading import gradescope
from paged_kv_course.grading.grader import CheckResult, GradeReport, TaskResult
from paged_kv_course.grading.notebook_tasks import cell_task, read_notebook, split_points

from test_release import FIXTURES, POINTS, REPO, solved
from test_release import demo_course as _demo_course

# https://gradescope-autograders.readthedocs.io/en/latest/specs/: every field of results.json that the page
# documents, with the values it lists; nothing else is allowed (additionalProperties: false).
_VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
_FORMAT = {"enum": ["text", "simple_format", "html", "md", "ansi"]}
GRADESCOPE_TEST = {
    "type": "object",
    "properties": {
        "score": {"type": "number"}, "max_score": {"type": "number"}, "status": {"enum": ["passed", "failed"]},
        "name": {"type": "string"}, "name_format": _FORMAT, "number": {"type": "string"},
        "output": {"type": "string"}, "output_format": _FORMAT,
        "tags": {"type": "array", "items": {"type": "string"}}, "visibility": _VISIBILITY,
        "extra_data": {"type": "object"},
    },
    "additionalProperties": False,
}
GRADESCOPE_RESULTS = {
    "type": "object",
    "properties": {
        "score": {"type": "number"}, "execution_time": {"type": "number"}, "output": {"type": "string"},
        "output_format": _FORMAT, "test_output_format": _FORMAT, "test_name_format": _FORMAT,
        "visibility": _VISIBILITY, "stdout_visibility": _VISIBILITY, "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": GRADESCOPE_TEST},
        "leaderboard": {"type": "array", "items": {
            "type": "object", "required": ["name", "value"],
            "properties": {"name": {"type": "string"}, "value": {"type": ["number", "string"]},
                           "order": {"enum": ["asc", "desc"]}}}},
    },
    "additionalProperties": False,
    # "score: optional, but required if not on each test case below"
    "anyOf": [{"required": ["score"]},
              {"required": ["tests"], "properties": {"tests": {"items": {"required": ["score"]}}}}],
}
# What this course adds to the documented format: a score on top, and every test named, scored and explained.
COURSE_TEST = {"required": ["name", "score", "max_score", "output", "visibility"]}


def demo_course(root: Path) -> Path:
    """The release tests' demo course, with the parts the autograder installs (placeholders here)."""
    course = _demo_course(root)
    (course / "paged_kv_lib").mkdir()
    (course / "paged_kv_lib" / "__init__.py").write_text("")
    (course / "pyproject.toml").write_text("")
    (course / "course").mkdir()
    (course / "course" / "pyproject.toml").write_text("")
    return course


def validate(results: dict) -> None:
    """results.json holds to Gradescope's documented format and to the course's stricter rule."""
    jsonschema.validate(results, GRADESCOPE_RESULTS)
    jsonschema.validate(results, {"required": ["score", "tests", "output"],
                                  "properties": {"tests": {"items": COURSE_TEST}}})
    assert results["score"] == pytest.approx(sum(t["score"] for t in results["tests"])), "the tests add up"


@pytest.fixture(autouse=True)
def _demo_checks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


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
    assert "bubblewrap" in setup and '"./course[triton]" ./course/course' in setup
    assert 'TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"' in setup and 'TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"' in setup
    assert 'ROOT="${GRADESCOPE_ROOT:-/autograder}"' in setup


def test_the_torch_index_given_to_the_builder_is_setup_shs_default(tmp_path):
    course = demo_course(tmp_path / "course")
    zipped = gradescope.build_autograder(course, tmp_path / "a.zip", "90", torch_index_url="file:///wheels/cpu")
    setup = zipfile.ZipFile(zipped).read("setup.sh").decode()
    assert 'TORCH_INDEX_URL="${TORCH_INDEX_URL:-file:///wheels/cpu}"' in setup
    with pytest.raises(gradescope.GradescopeError, match="cannot go into setup.sh"):
        gradescope.build_autograder(course, tmp_path / "b.zip", "90", torch_index_url='x"; rm -rf /')


def test_hidden_cases_are_tests_of_their_own_shown_after_publishing():
    checks = [CheckResult("check_a", 2, True), CheckResult("check_b", 1, False, "check_b failed: call"),
              CheckResult("hidden case 1", 1, True, "", 1),
              CheckResult("hidden case 2", 2, False, "hidden case 2 of task 03.1 failed: try 7 blocks", 2)]
    report = GradeReport(Path("s.ipynb"), "03_the_allocator", [
        TaskResult("03.1", 6, False, "check_b failed: call", "check_b(pool)\n  expected: 1\n  got: 2", checks),
        TaskResult("03.2", 3, True, checks=[CheckResult("check_c", 3, True)])])
    results = gradescope.results_json(report, execution_time=3.2)
    validate(results)
    tests = {t["name"]: t for t in results["tests"]}
    assert tests["task 03.1"]["score"] == 2 and tests["task 03.1"]["max_score"] == 3
    assert tests["task 03.1"]["visibility"] == "visible" and "expected: 1" in tests["task 03.1"]["output"]
    assert tests["task 03.1 hidden case 1"] == {
        "name": "task 03.1 hidden case 1", "number": "03.1.h1", "score": 1, "max_score": 1, "output": "passed",
        "output_format": "text", "visibility": "after_published"}
    assert tests["task 03.1 hidden case 2"]["score"] == 0
    assert tests["task 03.1 hidden case 2"]["output"] == "hidden case 2 of task 03.1 failed: try 7 blocks"
    assert results["score"] == report.earned == 6
    assert "try 7 blocks" not in results["output"], "a hidden case shows only in its own test"
    assert results["output_format"] == results["test_output_format"] == "text", "learner text never renders"


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
    validate(results)
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
    validate(results)
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"] == "the submission holds no notebook for exercise 90_demo (found: no notebook at all)"
    assert not list((root / "results").glob(".results.*"))


def test_a_grader_that_fails_still_writes_results_json(tmp_path, monkeypatch):
    """Without a results.json Gradescope shows the learner nothing: a failing grader scores 0 and says so."""
    from paged_kv_course.grading import grader

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(grader, "grade_notebook", broken)
    course = demo_course(tmp_path / "course")
    root = autograder_root(tmp_path, course, "90_demo")
    shutil.copy(course / "exercises" / "90_demo.ipynb", root / "submission" / "90_demo.ipynb")
    assert gradescope.main(["run", "--root", str(root)]) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    assert results["score"] == 0 and results["output"] == ("90_demo.ipynb: the grader failed (OSError); "
                                                           "ask your instructor")


def test_a_symlinked_submission_is_refused_not_graded(tmp_path):
    """The attack of issue 32: a submission that is a symlink into the autograder's own solutions graded full marks."""
    course = demo_course(tmp_path / "course")
    root = autograder_root(tmp_path, course, "90_demo")
    target = root / "source" / "course" / "exercises" / "solutions" / "90_demo.ipynb"
    (root / "submission" / "90_demo.ipynb").symlink_to(target)
    assert gradescope.main(["run", "--root", str(root)]) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    assert results["score"] == 0 and results["tests"] == []
    assert results["output"] == "90_demo.ipynb: is a symbolic link, not the learner's own file: refused, not graded"
    (root / "submission" / "90_demo.ipynb").unlink()
    (root / "submission" / "work").symlink_to(target.parent, target_is_directory=True)
    assert gradescope.main(["run", "--root", str(root)]) == 0
    output = json.loads((root / "results" / "results.json").read_text())["output"]
    assert output.startswith("the submission holds no notebook"), "a linked folder is not followed"


def test_a_notebook_of_another_exercise_says_which_it_is(tmp_path):
    course = demo_course(tmp_path / "course")
    root = autograder_root(tmp_path, course, "90_demo")
    nb = read_notebook(course / "exercises" / "90_demo.ipynb")
    nb.metadata["paged_kv"]["exercise"] = "02_blocks_and_block_tables"
    nbformat.write(nb, root / "submission" / "02_blocks_and_block_tables.ipynb")
    assert gradescope.main(["run", "--root", str(root)]) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    validate(results)
    assert results["score"] == 0
    assert results["output"] == ("02_blocks_and_block_tables.ipynb: this is a notebook of exercise "
                                 "02_blocks_and_block_tables, not of exercise 90_demo; submit your "
                                 "exercises/90_demo.ipynb")


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


# ---------------------------------------------------------------------------------------
# The zip as Gradescope runs it: setup.sh installs into a fresh venv, run_autograder grades exercise 03


def _with_solution_of(notebook: Path, source: Path, tasks: set, out: Path) -> Path:
    """``notebook`` with the solution cells of ``tasks`` taken from ``source``."""
    nb, donor = read_notebook(notebook), read_notebook(source)
    answers = {cell_task(c)[0]: c.source for c in donor.cells if cell_task(c) and cell_task(c)[1] == "solution"}
    for cell in nb.cells:
        found = cell_task(cell)
        if found and found[1] == "solution" and found[0] in tasks:
            cell.source = answers[found[0]]
    nbformat.write(nb, out)
    return out


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_zip_installs_with_its_own_setup_sh_and_grades_exercise_03(tmp_path):
    zipped = gradescope.build_autograder(REPO, tmp_path / "autograder.zip", "03")
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zipped) as archive:
        archive.extractall(root / "source")
        for info in archive.infolist():
            if (info.external_attr >> 16) & 0o777:
                os.chmod(root / "source" / info.filename, (info.external_attr >> 16) & 0o777)
    # Nothing of this checkout or its venv: the venv setup.sh makes is all run_autograder has.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PAGED_KV_PYTHON")}
    env["GRADESCOPE_ROOT"] = str(root)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    started = time.monotonic()
    setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=1500)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    assert "setup.sh: torch 2.13.0" in setup.stdout
    print(f"setup.sh: {time.monotonic() - started:.0f} s")
    venv_python = root / "venv" / "bin" / "python"
    probe = subprocess.run([str(venv_python), "-c", "import torch, paged_kv_course, sys; "
                            "print(torch.version.cuda, paged_kv_course.__file__)"],
                           env=env, capture_output=True, text=True, timeout=120)
    cuda, location = probe.stdout.split()
    assert cuda == "None", "the CPU build of torch"
    assert str(root / "venv") in location, "the course package as setup.sh installed it, not this checkout"

    solution = REPO / "exercises" / "solutions" / "03_the_allocator.ipynb"
    learner = REPO / "exercises" / "03_the_allocator.ipynb"
    work = tmp_path / "notebooks"
    work.mkdir()

    def grade(name: str, place) -> dict:
        shutil.rmtree(root / "submission", ignore_errors=True)
        shutil.rmtree(root / "results", ignore_errors=True)
        (root / "submission").mkdir()
        place(root / "submission" / name)
        begun = time.monotonic()
        done = subprocess.run([str(root / "source" / "run_autograder")], cwd=root, env=env, capture_output=True,
                              text=True, timeout=900)
        print(f"run_autograder, {name}: {time.monotonic() - begun:.0f} s")
        assert done.returncode == 0, done.stdout + done.stderr
        results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
        validate(results)
        return results

    complete = grade("03_the_allocator.ipynb", lambda path: shutil.copy(solution, path))
    assert complete["score"] == 10 and [t["name"] for t in complete["tests"]] == ["task 03.1", "task 03.2", "task 03.3"]
    assert all(t["score"] == t["max_score"] and t["output"] == f"PASSED {t['number']}" for t in complete["tests"])

    partial_nb = _with_solution_of(learner, solution, {"03.1", "03.3"}, work / "partial.ipynb")
    partial = grade("03_the_allocator.ipynb", lambda path: shutil.copy(partial_nb, path))
    scores = {t["name"]: (t["score"], t["max_score"]) for t in partial["tests"]}
    assert scores == {"task 03.1": (4, 4), "task 03.2": (0, 3), "task 03.3": (3, 3)}
    assert partial["score"] == 7
    assert "task 03.2 is not written yet" in next(t["output"] for t in partial["tests"] if t["name"] == "task 03.2")

    empty = grade("03_the_allocator.ipynb", lambda path: shutil.copy(learner, path))
    assert empty["score"] == 0 and all(t["score"] == 0 for t in empty["tests"])
    assert [t["output"].splitlines()[0] for t in empty["tests"]] == [
        f"task {n} is not written yet" for n in ("03.1", "03.2", "03.3")]

    wrong = grade("02_blocks_and_block_tables.ipynb",
                  lambda path: shutil.copy(REPO / "exercises" / "solutions" / "02_blocks_and_block_tables.ipynb", path))
    assert wrong["score"] == 0 and wrong["tests"] == []
    assert wrong["output"] == ("02_blocks_and_block_tables.ipynb: this notebook holds tasks of exercise 02, "
                               "not of exercise 03_the_allocator; submit your exercises/03_the_allocator.ipynb")
    assert "saved under the name" not in wrong["output"]

    linked = grade("03_the_allocator.ipynb", lambda path: path.symlink_to(
        root / "source" / "course" / "exercises" / "solutions" / "03_the_allocator.ipynb"))
    assert linked["score"] == 0 and linked["tests"] == []
    assert "is a symbolic link" in linked["output"]
    print(f"whole test: {time.monotonic() - started:.0f} s")
