"""Releases without solutions, and grading from a normal (non-editable) install outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from paged_kv_lib import cli
from paged_kv_course.grading import release
from paged_kv_course.grading.notebook_tasks import cell_task, read_notebook

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "grading"
POINTS = {"90.1": 2, "90.2": 1, "90.3": 3}
SOLVED = {
    "90.1": "def add(a, b):\n    return a + b\n",
    "90.2": "class Counter:\n    def __init__(self):\n        self.count = 0\n\n"
            "    def bump(self):\n        self.count += 1\n        return self.count\n",
    "90.3": "def blocks_needed(num_tokens, block_size):\n    return -(-num_tokens // block_size)\n",
}


def demo_course(root: Path) -> Path:
    """A small course: a lesson, the demo exercise with its solution, a check module, tests."""
    (root / "exercises" / "solutions").mkdir(parents=True)
    shutil.copy(FIXTURES / "solutions" / "90_demo.ipynb", root / "exercises" / "solutions")
    shutil.copy(FIXTURES / "90_demo.ipynb", root / "exercises")
    (root / "lessons").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 01")]), root / "lessons" / "01_x.ipynb")
    (root / "tests").mkdir()
    (root / "tests" / "test_answers.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "README.md").write_text("# course\n")
    (root / "checks").mkdir()
    shutil.copy(FIXTURES / "demo_checks.py", root / "checks")
    return root


def solved(notebook: Path, out: Path) -> Path:
    nb = read_notebook(notebook)
    for cell in nb.cells:
        found = cell_task(cell)
        if found and found[1] == "solution":
            cell.source = SOLVED[found[0]]
    nbformat.write(nb, out)
    return out


def test_release_has_the_learner_course_and_no_solutions(tmp_path, capsys):
    course = demo_course(tmp_path / "course")
    out = tmp_path / "release"
    assert cli.main(["release", "--out", str(out), "--course", str(course)]) == 0
    assert "no solutions" in capsys.readouterr().out
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"README.md", "lessons/01_x.ipynb", "exercises/90_demo.ipynb", "exercises/pristine/90_demo.ipynb"} <= files
    assert not any(f.startswith(("exercises/solutions", "tests/")) for f in files), files
    for path in out.rglob("*.ipynb"):
        assert "BEGIN SOLUTION" not in path.read_text() and "return a + b" not in path.read_text()
    # A second release into the same folder is refused in one line; so is a folder inside the course.
    assert cli.main(["release", "--out", str(out), "--course", str(course)]) == 2
    assert "is not an empty folder" in capsys.readouterr().err
    assert cli.main(["release", "--out", str(course / "rel"), "--course", str(course)]) == 2
    assert "outside the course folder" in capsys.readouterr().err
    assert cli.main(["release", "--out", str(tmp_path / "r2"), "--course", str(out)]) == 2
    assert "no exercises/solutions/" in capsys.readouterr().err


def test_a_release_has_a_learner_readme_a_dockerignore_and_the_course_package(tmp_path):
    course = demo_course(tmp_path / "course")
    shutil.copytree(REPO / "course", course / "course", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (course / "docs").mkdir()
    for name in ("exercises.md", "instructors.md", "class.md"):
        (course / "docs" / name).write_text(f"# {name}\n")
    out = tmp_path / "release"
    release.build_release(course, out)
    assert (out / "course" / "pyproject.toml").is_file() and (out / "course" / "paged_kv_course" / "grading").is_dir()
    assert not (out / "docs" / "instructors.md").exists() and not (out / "docs" / "class.md").exists()
    readme = (out / "README.md").read_text()
    assert "make test" not in readme and "make check" in readme and "make lab" in readme
    assert "[docs/exercises.md](docs/exercises.md)" in readme
    assert "instructors.md" not in readme and "class.md" not in readme and "platforms.md" not in readme
    assert release.readme_problems(out) == []
    ignored = (out / ".dockerignore").read_text().splitlines()
    assert {".venv", ".git", "**/__pycache__"} <= set(ignored)
    (out / "README.md").write_text("Run `make test`, then read [the guide](docs/instructors.md).\n")
    assert release.readme_problems(out) == [
        "it tells learners to run `make test` (a release has no tests/)",
        "it links docs/instructors.md, which the release leaves out"]


def test_the_repository_has_the_dockerignore_a_release_carries(tmp_path):
    """An image built from a folder holding a learner's .venv must not send it to Docker (issue 34,
    item 8): the repository has a .dockerignore, a release copies the course's own, and a course
    without one gets the same text."""
    text = (REPO / ".dockerignore").read_text()
    assert text == release.DOCKERIGNORE
    assert {".venv", ".git", "**/__pycache__", "test-artifacts"} <= set(text.splitlines())
    assert ".dockerignore" in release.RELEASED
    course = demo_course(tmp_path / "course")
    (course / ".dockerignore").write_text(".venv\nmy-own-rule\n")
    (course / ".venv" / "lib").mkdir(parents=True)
    (course / ".venv" / "lib" / "big.so").write_bytes(b"x")
    out = tmp_path / "release"
    release.build_release(course, out)
    assert (out / ".dockerignore").read_text() == ".venv\nmy-own-rule\n"
    assert not (out / ".venv").exists()


def test_a_release_that_keeps_the_placeholder_url_is_told_so(tmp_path):
    from paged_kv_course.setup_cell import PLACEHOLDER_URL, setup_cell_source

    (tmp_path / "lessons").mkdir()
    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(setup_cell_source(PLACEHOLDER_URL))])
    nbformat.write(lesson, tmp_path / "lessons" / "01_x.ipynb")
    assert release.placeholder_kept(tmp_path)
    lesson.cells[0].source = setup_cell_source("https://example.org/our-class/paged-kv.git")
    nbformat.write(lesson, tmp_path / "lessons" / "01_x.ipynb")
    assert not release.placeholder_kept(tmp_path)


def test_a_release_refuses_a_learner_version_that_would_leak_a_solution(tmp_path, monkeypatch):
    course = demo_course(tmp_path / "course")

    def leaky(solutions: Path, out: Path, check: bool = False):
        shutil.copy(solutions / "90_demo.ipynb", out / "90_demo.ipynb")
        return []

    monkeypatch.setattr("paged_kv_course.grading.generate.generate", leaky)
    with pytest.raises(release.ReleaseError, match="still holds a solution region"):
        release.build_release(course, tmp_path / "release")
    assert not (tmp_path / "release").exists() and not (tmp_path / ".release.partial").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grading_from_a_wheel_installed_outside_the_checkout(tmp_path):
    """``pip install`` (not editable) into a fresh environment, then grade a notebook of a released
    course from an unrelated folder: the grader finds the course from the notebook's own path."""
    source = tmp_path / "source"  # a copy, so that building leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "paged_kv_lib", source / "paged_kv_lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "course", source / "course", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    wheels = tmp_path / "wheels"
    for project in (source, source / "course"):  # the library, then the course package that grades
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(wheels), str(project)], check=True, cwd=tmp_path, timeout=300)
    (wheel,) = wheels.glob("paged_kv-*.whl")
    (course_wheel,) = wheels.glob("paged_kv_course-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "course_deps.pth").write_text(deps + "\n")  # torch and friends, after the wheel's copy
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel), str(course_wheel)],
                   check=True, timeout=300)
    course = demo_course(tmp_path / "course")
    out = tmp_path / "learner_course"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(course / "checks"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(py), "-c", "import paged_kv_lib; print(paged_kv_lib.__file__)"], env=env,
                           cwd=elsewhere, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv), f"the installed copy must be used, not {where}"
    released = subprocess.run([str(venv / "bin" / "paged-kv"), "release", "--course", str(course), "--out", str(out)],
                              env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert released.returncode == 0, released.stderr
    # The learner solves the exercise in their released course and grades it from anywhere.
    notebook = solved(out / "exercises" / "90_demo.ipynb", out / "exercises" / "90_demo.ipynb")
    graded = subprocess.run([str(venv / "bin" / "paged-kv"), "grade", str(notebook)], env=env, cwd=elsewhere,
                            capture_output=True, text=True, timeout=300)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert "total  6/6" in graded.stdout
    # The instructor grades the same notebook against their own checkout's solutions.
    graded = subprocess.run([str(venv / "bin" / "paged-kv"), "grade", str(notebook), "--course", str(course)],
                            env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert graded.returncode == 0 and "total  6/6" in graded.stdout, graded.stdout + graded.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_releasing_this_course_leaves_out_every_solution(tmp_path):
    out = tmp_path / "release"
    files = release.build_release(REPO, out)
    names = {p.relative_to(out).as_posix() for p in files}
    assert any(n.startswith("lessons/") for n in names) and "README.md" in names
    assert not any(n.startswith(("exercises/solutions/", "exercises/hidden/", "tests/")) for n in names)
    assert (REPO / "exercises" / "hidden").is_dir(), "the course keeps hidden cases, and the release leaves them out"
    solutions = sorted((REPO / "exercises" / "solutions").glob("[0-9][0-9]_*.ipynb"))
    for path in solutions:
        assert (out / "exercises" / path.name).is_file() and (out / "exercises" / "pristine" / path.name).is_file()
    for path in out.rglob("*.ipynb"):
        assert "### BEGIN SOLUTION" not in path.read_text(encoding="utf-8"), path
