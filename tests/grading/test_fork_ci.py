"""A learner's fork keeps a green sync gate; the course's own CI still catches a stale learner version.

A temporary clone of the course's exercises (solutions and learner versions) stands for the
fork. The gate's command is ``python -m paged_kv_course.grading.generate --check`` (what the
sync gate in tests/exercises/test_exercises_gates.py runs), with and without ``PAGED_KV_LEARNER_FORK``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paged_kv_course.grading import generate, learner_work
from paged_kv_course.grading.notebook_tasks import read_notebook

ROOT = Path(__file__).resolve().parents[2]
FORK_ENV = learner_work.FORK_ENV


@pytest.fixture
def clone(tmp_path):
    """A copy of the course's exercises/ (solutions and learner versions), as a fork would have them."""
    out = tmp_path / "fork"
    shutil.copytree(ROOT / "exercises", out / "exercises")
    return out


def gate(course: Path, fork: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != FORK_ENV}
    if fork:
        env[FORK_ENV] = "true"
    return subprocess.run([sys.executable, "-m", "paged_kv_course.grading.generate", "--check",
                           "--solutions", str(course / "exercises" / "solutions")],
                          capture_output=True, text=True, env=env, timeout=300)


def first_exercise(course: Path) -> Path:
    return generate.solution_paths(course / "exercises" / "solutions")[0]


def finish(course: Path) -> Path:
    """The learner finished the first exercise in their copy of its learner version: every solution cell
    holds the solution's code, the cells ran (outputs, counts), JupyterLab saved its own notebook
    metadata, and the learner added a scratch cell of their own."""
    solution = first_exercise(course)
    answers = {c["metadata"]["paged_kv"]["task"]: c["source"] for c in json.loads(solution.read_text())["cells"]
               if c.get("metadata", {}).get("paged_kv", {}).get("role") == "solution"}
    target = course / "exercises" / solution.name
    mine = json.loads(target.read_text())
    for count, cell in enumerate(mine["cells"], start=1):
        meta = cell.get("metadata", {}).get("paged_kv", {})
        if cell["cell_type"] != "code":
            continue
        cell["execution_count"] = count
        if meta.get("role") == "solution":
            cell["source"] = answers[meta["task"]]
        elif meta.get("role") == "check":
            cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": f"PASSED {meta['task']}\n"}]
    mine["metadata"]["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    mine["cells"].insert(2, {"cell_type": "code", "execution_count": None, "id": "scratch1", "metadata": {},
                             "outputs": [], "source": "print('trying things')"})
    target.write_text(json.dumps(mine, indent=1))
    return target


def test_a_fork_with_a_finished_exercise_keeps_the_gate_green(clone):
    target = finish(clone)
    strict = gate(clone, fork=False)
    assert strict.returncode == 1 and target.name in strict.stderr, "the course's own CI: not a fresh generation"
    forked = gate(clone, fork=True)
    assert forked.returncode == 0, forked.stderr
    assert learner_work.worked_exercises(clone / "exercises" / "solutions", clone / "exercises") == [target.name[:2]]


def test_a_stale_learner_version_fails_in_the_course_and_in_a_fork(clone):
    solution = first_exercise(clone)
    nb = json.loads(solution.read_text())
    markdown = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and "paged_kv" not in c.get("metadata", {}))
    markdown["source"] = "".join(markdown["source"]) + "\n\nA sentence the authors added."
    solution.write_text(json.dumps(nb, indent=1))  # the solutions changed; `make exercises` was not run
    for fork in (False, True):
        done = gate(clone, fork)
        assert done.returncode == 1 and solution.name in done.stderr, (fork, done.stderr)


def test_a_fork_whose_check_cells_changed_is_stale(clone):
    target = finish(clone)
    nb = read_notebook(target)
    fresh = read_notebook(first_exercise(clone))
    problems = learner_work.learner_work_problems(nb, generate.make_learner_version(fresh, target.name))
    assert problems == []
    check = next(c for c in nb.cells if c.get("metadata", {}).get("paged_kv", {}).get("role") == "check")
    check.source = "print('PASSED')"
    problems = learner_work.learner_work_problems(nb, generate.make_learner_version(fresh, target.name))
    assert problems and "check cells differ" in problems[0]


def test_make_exercises_in_a_fork_leaves_the_learners_work_alone(clone, monkeypatch):
    target = finish(clone)
    before = target.read_text()
    written = generate.generate(clone / "exercises" / "solutions", clone / "exercises", learner_work=True)
    assert target not in written and target.read_text() == before
    monkeypatch.setenv(FORK_ENV, "yes")
    assert learner_work.in_learner_fork()
    monkeypatch.setenv(FORK_ENV, "false")
    assert not learner_work.in_learner_fork()


def test_the_course_workflow_tells_the_gate_it_runs_in_a_fork():
    text = (ROOT / ".github" / "workflows" / "course.yml").read_text()
    assert f"{FORK_ENV}: ${{{{ github.event.repository.fork }}}}" in text
    assert "paged_kv_course.grading.learner_work" in text and "make check EXERCISES=" in text
