"""A released class repository checks itself: `make check`, its workflow, and GitHub Classroom's tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml

from paged_kv_lib import cli
from paged_kv_course.grading import classroom, release
from paged_kv_course.grading.notebook_tasks import split_points

from test_release import FIXTURES, POINTS, REPO, demo_course, solved


@pytest.fixture(autouse=True)
def _demo_checks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))


@pytest.fixture
def released(tmp_path) -> Path:
    course = demo_course(tmp_path / "course")
    shutil_copy_makefile(course)
    out = tmp_path / "release"
    release.build_release(course, out)
    return out


def shutil_copy_makefile(course: Path) -> None:
    (course / "course").mkdir(exist_ok=True)
    for name in ("Makefile", "pyproject.toml", "course/pyproject.toml"):
        shutil.copy2(REPO / name, course / name)  # copy2: the venv's install stamp stays newer
    shutil.copytree(REPO / "scripts", course / "scripts")  # make install's torch check lives there


def test_the_release_carries_a_check_workflow_and_classroom_autograding(released):
    check = yaml.safe_load((released / ".github" / "workflows" / "check.yml").read_text())
    steps = check["jobs"]["check"]["steps"]
    assert any("make check" in step.get("run", "") for step in steps)
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") for step in steps)
    graded = yaml.safe_load((released / ".github" / "workflows" / "classroom.yml").read_text())
    steps = graded["jobs"]["run-autograding-tests"]["steps"]
    tests = [s for s in steps if s.get("uses", "").startswith("classroom-resources/autograding-command-grader")]
    # 90.3 is judged by two check cells: a test per check cell, each with its share (partial credit)
    shares = split_points(POINTS["90.3"], [None, None])
    want = {f"task {t}": p for t, p in POINTS.items() if t != "90.3"}
    want.update({f"task 90.3 check {n}": share for n, share in enumerate(shares, start=1)})
    assert {s["with"]["test-name"]: s["with"]["max-score"] for s in tests} == want
    assert sum(s["with"]["max-score"] for s in tests) == sum(POINTS.values())
    for step in tests:
        name = step["with"]["test-name"].split()
        extra = f" --check {name[3]}" if len(name) > 2 else ""
        assert step["with"]["command"] == f".venv/bin/paged-kv grade exercises/90_demo.ipynb --task {name[1]}{extra}"
    (reporter,) = [s for s in steps if s.get("uses", "").startswith("classroom-resources/autograding-grading-reporter")]
    assert reporter["with"]["runners"].split(",") == [s["id"] for s in tests]
    assert set(reporter["env"]) == {s["id"].upper().replace("-", "_") + "_RESULTS" for s in tests}


def test_grade_task_exits_0_only_for_that_task(released, capsys, monkeypatch):
    monkeypatch.chdir(released)
    notebook = released / "exercises" / "90_demo.ipynb"
    nb = solved(notebook, released / "exercises" / "mine.ipynb")
    text = nb.read_text().replace("return -(-num_tokens // block_size)", "return num_tokens // block_size")
    nb.write_text(text)
    assert cli.main(["grade", str(nb), "--task", "90.1"]) == 0
    assert cli.main(["grade", str(nb), "--task", "90.3"]) == 1
    assert cli.main(["grade", str(nb), "--task", "90.3", "--check", "1"]) == 1, "check_blocks fails a floor"
    assert cli.main(["grade", str(nb), "--task", "90.3", "--check", "2"]) == 0, "check_blocks_zero passes it"
    assert cli.main(["grade", str(nb), "--task", "90.9"]) == 2
    assert "no such task (its tasks: 90.1, 90.2, 90.3)" in capsys.readouterr().err


@pytest.mark.slow
def test_make_check_is_green_on_finished_work_and_names_the_tasks_of_untouched_work(released, tmp_path):
    venv = REPO / ".venv"
    env = dict(os.environ, PYTHONPATH=str(FIXTURES))

    def make_check() -> subprocess.CompletedProcess:
        return subprocess.run(["make", "check", f"VENV={venv}", f"CHECK_SUMMARY={tmp_path / 'summary.md'}"],
                              cwd=released, env=env, capture_output=True, text=True, timeout=600)

    untouched = make_check()
    assert untouched.returncode != 0
    assert "nbval: FAILED" in untouched.stdout
    for task in POINTS:
        assert re.search(rf"^{re.escape(task)}\s+0/{POINTS[task]}\s+FAIL", untouched.stdout, re.M), untouched.stdout
    solved(released / "exercises" / "90_demo.ipynb", released / "exercises" / "90_demo.ipynb")
    finished = make_check()
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "nbval: passed" in finished.stdout
    assert [line.split()[0] for line in finished.stdout.splitlines() if line.endswith("pass")] == list(POINTS)
    assert "total     6/6" in finished.stdout
    assert "| 90.3 | 3/3 | pass |" in (tmp_path / "summary.md").read_text()


def test_check_names_an_unknown_exercise(released, capsys, monkeypatch):
    monkeypatch.chdir(released)
    assert cli.main(["check", "42", "--no-nbval"]) == 2
    assert "no exercise '42'" in capsys.readouterr().err


def test_starters_ship_only_for_exercises_before_the_assignment(tmp_path):
    course = demo_course(tmp_path / "course")
    starters = course / release.STARTERS
    starters.mkdir(parents=True)
    for name in ("__init__.py", "after_02.py", "after_03.py", "after_05.py"):
        (starters / name).write_text("# starter\n")
    (course / "docs").mkdir()
    (course / "docs" / "instructors.md").write_text("the threat model\n")
    (course / "docs" / "exercises.md").write_text("how to do the exercises\n")
    release.build_release(course, tmp_path / "r05", assignment=5)
    shipped = sorted(p.name for p in (tmp_path / "r05" / release.STARTERS).iterdir())
    assert shipped == ["__init__.py", "after_02.py", "after_03.py"]
    assert not (tmp_path / "r05" / "docs" / "instructors.md").exists()
    assert (tmp_path / "r05" / "docs" / "exercises.md").is_file()
    release.build_release(course, tmp_path / "rall")
    assert sorted(p.name for p in (tmp_path / "rall" / release.STARTERS).iterdir()) == ["__init__.py"]
    assert classroom.step_id("03.1") == "task-03-1"


def test_a_release_writes_the_class_repository_into_every_setup_block(tmp_path):
    course = demo_course(tmp_path / "course")
    shutil.copytree(REPO / "paged_kv_lib", course / "paged_kv_lib", ignore=shutil.ignore_patterns("__pycache__"))
    url = "https://example.org/our-class/paged-kv.git"
    out = tmp_path / "release"
    release.build_release(course, out, repo_url=url)
    from paged_kv_course import setup_cell

    for notebook in [out / "exercises" / "90_demo.ipynb", out / "exercises" / "pristine" / "90_demo.ipynb"]:
        first = next(c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
        assert setup_cell.check(notebook) is None and f'COURSE_REPO = "{url}"' in first.source
    assert (out / "exercises" / "90_demo.ipynb").read_text() == (out / "exercises" / "pristine" / "90_demo.ipynb").read_text()
    with pytest.raises(setup_cell.SetupCellError, match="expected an https:// or git@ URL"):
        release.build_release(course, tmp_path / "bad", repo_url="not a url")
    assert not (tmp_path / "bad").exists()
