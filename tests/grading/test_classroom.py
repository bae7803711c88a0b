"""A released class repository checks itself: `make check` and its plain GitHub Actions workflow.

GitHub Classroom's autograding is gone (the application is sunset, and a score computed in the learner's own
repository is the learner's to change): the release writes no classroom.yml; credit comes from Gradescope or
the instructor's batch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from paged_kv_lib import cli
from paged_kv_course.grading import release

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
    for name in ("Makefile", "pyproject.toml", "course/pyproject.toml"):
        (course / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, course / name)
    shutil.copytree(REPO / "scripts", course / "scripts")  # make install's torch check lives there


def test_the_release_carries_a_check_workflow_and_no_classroom_autograding(released):
    assert sorted(p.name for p in (released / ".github" / "workflows").iterdir()) == ["check.yml"]
    check = yaml.safe_load((released / ".github" / "workflows" / "check.yml").read_text())
    steps = check["jobs"]["check"]["steps"]
    assert any("make check" in step.get("run", "") for step in steps)
    assert any("GITHUB_STEP_SUMMARY" in step.get("run", "") for step in steps)
    assert not any("classroom" in step.get("uses", "") for step in steps)
    assert "feedback, not the grade" in (released / ".github" / "workflows" / "check.yml").read_text()


@pytest.mark.slow
def test_make_check_is_green_on_finished_work_and_names_the_tasks_of_untouched_work(released, tmp_path):
    venv = Path(sys.prefix)  # the venv running the tests, already holding the learner's install
    stamp = tmp_path / "installed-lab"
    stamp.touch()  # newer than the release's pyproject files: make installs nothing into the shared venv
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))

    def make_check() -> subprocess.CompletedProcess:
        return subprocess.run(["make", "check", f"VENV={venv}", f"LAB_STAMP={stamp}",
                               f"CHECK_SUMMARY={tmp_path / 'summary.md'}"],
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


def test_make_check_in_a_fresh_release_installs_the_learners_dependencies_only(released, tmp_path):
    dry = subprocess.run(["make", "-n", "check", f"VENV={tmp_path / 'fresh'}"], cwd=released,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    installs = [line for line in dry.stdout.splitlines() if "pip install" in line and "-e" in line]
    assert len(installs) == 1 and '-e ".[lab,triton]" -e ./course' in installs[0], dry.stdout
    assert "[dev]" not in dry.stdout, "make check does not install the dev tools"


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
    shipped = {p.name: p.read_text() for p in (tmp_path / "r05" / release.STARTERS).iterdir()}
    assert sorted(shipped) == ["__init__.py", "after_02.py", "after_03.py", "after_05.py"]
    assert shipped["after_03.py"] == "# starter\n"
    # exercise 05's own starter is withheld: in its place a module that only names what is missing
    assert "# starter" not in shipped["after_05.py"] and release.withheld_line("05") in shipped["after_05.py"]
    assert not (tmp_path / "r05" / "docs" / "instructors.md").exists()
    assert (tmp_path / "r05" / "docs" / "exercises.md").is_file()
    release.build_release(course, tmp_path / "rall")
    everything = {p.name: p.read_text() for p in (tmp_path / "rall" / release.STARTERS).iterdir()}
    assert all("# starter" not in text for name, text in everything.items() if name != "__init__.py")  # none ships


def test_a_release_writes_the_class_repository_into_every_setup_block(tmp_path):
    course = demo_course(tmp_path / "course")
    shutil.copytree(REPO / "paged_kv_lib", course / "paged_kv_lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", course / "pyproject.toml")
    url = "https://example.org/our-class/paged-kv.git"
    out = tmp_path / "release"
    release.build_release(course, out, repo_url=url)
    from paged_kv_course import setup_cell

    # The release names the class repository everywhere: its pyproject too, with no placeholder left.
    assert setup_cell.repository_url(out / "pyproject.toml") == url
    assert "PLACEHOLDER" not in (out / "pyproject.toml").read_text()
    assert setup_cell.PLACEHOLDER_URL not in "".join(p.read_text() for p in out.rglob("*.ipynb"))

    for notebook in [out / "exercises" / "90_demo.ipynb", out / "exercises" / "pristine" / "90_demo.ipynb"]:
        first = next(c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
        assert setup_cell.check(notebook) is None and f'COURSE_REPO = "{url}"' in first.source
    assert (out / "exercises" / "90_demo.ipynb").read_text() == (out / "exercises" / "pristine" / "90_demo.ipynb").read_text()
    with pytest.raises(setup_cell.SetupCellError, match="expected an https:// or git@ URL"):
        release.build_release(course, tmp_path / "bad", repo_url="not a url")
    assert not (tmp_path / "bad").exists()
