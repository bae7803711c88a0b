"""Gradebooks for LMS imports (wide, Canvas with a roster) and per-learner reports, from graded results."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import Tuple

import pytest

from paged_kv_lib import cli
from paged_kv_course.grading import gradebook
from paged_kv_course.grading.batch import BatchResult, Submission
from paged_kv_course.grading.grader import GradeReport, TaskResult


def result(learner: str, exercise: str, passed: dict, points: dict, detail: str = "", error: str = "") -> BatchResult:
    tasks = [TaskResult(task, points[task], ok, "" if ok else f"{task} failed: call", "" if ok else detail)
             for task, ok in passed.items()]
    path = Path(f"/class/{learner}/{exercise}.ipynb")
    return BatchResult(Submission(learner, exercise, path), GradeReport(path, exercise, tasks, [], error))


POINTS = {"03.1": 2, "03.2": 3, "03.3": 2}
CLASS = [
    result("ada", "03_the_allocator", {"03.1": True, "03.2": True, "03.3": False}, POINTS,
           detail="my_check_pool(pool)\n  expected: AssertionError\n  got:      None\n  hint: a negative id"),
    result("ada", "02_blocks", {"02.1": True}, {"02.1": 4}),
    result("=cmd|' /C calc'!A0", "03_the_allocator", {"03.1": False, "03.2": False, "03.3": False}, POINTS),
    result("bob", "02_blocks", {"02.1": False}, {"02.1": 4}),
]


def read(path: Path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_wide_gradebook_has_a_row_per_learner_a_column_per_task_and_notebook(tmp_path):
    out = tmp_path / "wide.csv"
    assert gradebook.write(CLASS, out, "wide") == 3
    rows = {r["learner"]: r for r in read(out)}
    with open(out, encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
    assert header == ["learner", "02.1", "02_blocks", "03.1", "03.2", "03.3", "03_the_allocator", "total", "max", "flag"]
    assert rows["ada"]["03_the_allocator"] == "5" and rows["ada"]["03.3"] == "0" and rows["ada"]["total"] == "9"
    assert rows["ada"]["max"] == "11"
    assert rows["bob"]["03.1"] == "" and rows["bob"]["03_the_allocator"] == "", "no submission is blank, not 0"
    assert rows["bob"]["total"] == "0"
    escaped = [r for r in rows if r.startswith("'=")]
    assert escaped == ["'=cmd|' /C calc'!A0"], "a formula in a learner's folder name is escaped"


def roster(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "roster.csv"
    path.write_text(text, encoding="utf-8")
    return path


# Canvas's grade-import CSV, as documented:
# - https://community.canvaslms.com/t5/Instructor-Guide/How-do-I-import-grades-in-the-Gradebook/ta-p/807 (Canvas's
#   guide to importing grades: start from an exported gradebook and keep its columns);
# - https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades
#   (the import's columns: Student name OR ID OR SIS User ID identify the student, then SIS Login ID, Section and
#   one column per assignment; "new assignment columns in the Gradebook generate new assignments");
# - https://nemogb-dev.github.io/nemogb-r/articles/detailed-canvas-export-info.html (a Canvas gradebook CSV: "ID" is
#   the student's Canvas id, "SIS User ID" the id of the institution's SIS, and an assignment's column is
#   "Quiz 1 (87568490)": its name and the id Canvas gave it);
# - the "Points Possible" row: an exported Canvas gradebook has it under the header (Student cell "Points
#   Possible", each assignment cell its points). None of the pages above that could be read here documents it;
#   issue 32 asks for it, and export readers take the first data row as the maximum points, for example
#   https://gist.github.com/robobenklein/f0d423830837a1826903fd255a2e26a4.


def test_the_canvas_gradebook_takes_names_and_ids_from_the_roster(tmp_path):
    path = roster(tmp_path, "learner,name,id,sis_login,section\nada,Ada Lovelace,101,ada@u,A\n"
                            "bob,Bob Ross,102,bob@u,B\ncyd,Cyd Charisse,103,cyd@u,A\n")
    out = tmp_path / "canvas.csv"
    gradebook.write(CLASS, out, "canvas", gradebook.read_roster(path))
    rows = read(out)
    with open(out, encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
    assert header == ["Student", "ID", "SIS Login ID", "Section", "02_blocks", "03_the_allocator"], \
        "no SIS User ID column when the roster has none (never the Canvas id in its place)"
    assert rows[0] == {"Student": "Points Possible", "ID": "", "SIS Login ID": "", "Section": "",
                       "02_blocks": "4", "03_the_allocator": "7"}
    by_name = {r["Student"]: r for r in rows[1:]}
    assert by_name["Ada Lovelace"]["03_the_allocator"] == "5" and by_name["Ada Lovelace"]["SIS Login ID"] == "ada@u"
    assert by_name["Ada Lovelace"]["ID"] == "101"
    assert by_name["Cyd Charisse"]["02_blocks"] == "", "a learner with no submission gets blank cells"
    missing = [r for r in rows if gradebook.NOT_IN_ROSTER in r["Student"]]
    assert len(missing) == 1 and missing[0]["ID"] == "" and missing[0]["Student"].startswith("'=")


def test_canvas_columns_carry_the_assignment_ids_and_sis_ids_only_where_the_roster_has_them(tmp_path):
    path = roster(tmp_path, "learner,name,id,sis_login,section,sis_user_id\nada,Ada Lovelace,101,ada@u,A,S-9\n"
                            "bob,Bob Ross,102,bob@u,B,\n")
    (tmp_path / gradebook.ASSIGNMENTS_FILE).write_text("exercise,assignment_id\n03_the_allocator,12345\n")
    out = tmp_path / "canvas.csv"
    gradebook.write(CLASS, out, "canvas", gradebook.read_roster(path))
    with open(out, encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "02_blocks",
                      "03_the_allocator (12345)"]
    rows = read(out)
    assert rows[0]["Student"] == "Points Possible" and rows[0]["03_the_allocator (12345)"] == "7"
    by_name = {r["Student"]: r for r in rows[1:]}
    assert by_name["Ada Lovelace"]["SIS User ID"] == "S-9" and by_name["Ada Lovelace"]["ID"] == "101"
    assert by_name["Bob Ross"]["SIS User ID"] == "", "a blank SIS id stays blank, not the Canvas id"
    (tmp_path / gradebook.ASSIGNMENTS_FILE).write_text("exercise,assignment_id\n03_the_allocator,twelve\n")
    assert "numeric assignment_id" in gradebook.output_problem("canvas", path, None)


def test_a_learner_folder_with_no_notebook_is_listed_at_0_with_its_reason(tmp_path):
    from paged_kv_course.grading.batch import NO_NOTEBOOK

    empty = BatchResult(Submission("dee", "", Path("/class/dee"), NO_NOTEBOOK),
                        GradeReport(Path("/class/dee"), "", [], [], NO_NOTEBOOK))
    wide = tmp_path / "wide.csv"
    gradebook.write(CLASS + [empty], wide, "wide")
    dee = {r["learner"]: r for r in read(wide)}["dee"]
    assert dee["03_the_allocator"] == "0" and dee["02_blocks"] == "0" and dee["total"] == "0"
    assert dee["flag"] == NO_NOTEBOOK
    path = roster(tmp_path, "learner,name,id,sis_login\ndee,Dee Dee,104,dee@u\n")
    canvas = tmp_path / "canvas.csv"
    gradebook.write(CLASS + [empty], canvas, "canvas", gradebook.read_roster(path))
    assert {r["Student"]: r for r in read(canvas)}["Dee Dee"]["03_the_allocator"] == "0"


@pytest.mark.parametrize("text, message", [
    ("learner,name,id\nada,Ada,1\n", "no column 'sis_login'"),
    ("learner,name,id,sis_login,email\nada,Ada,1,a,a@u\n", "unknown column 'email'"),
    ("learner,name,id,sis_login\nada,Ada,1,a\nada,Ada,2,b\n", "line 3 repeats learner 'ada'"),
    ("learner,name,id,sis_login\n,Ada,1,a\n", "line 2 has no learner"),
])
def test_a_bad_roster_is_refused_in_one_line(tmp_path, text, message):
    with pytest.raises(gradebook.GradebookError, match=message):
        gradebook.read_roster(roster(tmp_path, text))
    assert message in gradebook.output_problem("canvas", tmp_path / "roster.csv", None)


def test_gradebook_options_are_checked_before_anything_is_graded(tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("graded although the options were wrong")

    monkeypatch.setattr("paged_kv_course.grading.batch.grade_batch", never)
    (tmp_path / "class" / "ada").mkdir(parents=True)
    base = ["grade", "--batch", str(tmp_path / "class"), "--csv", str(tmp_path / "g.csv")]
    for extra, message in [(["--format", "tall"], "--format 'tall': not one of long, wide, canvas"),
                           (["--format", "canvas"], "--format canvas needs --roster FILE"),
                           (["--format", "wide", "--roster", "r.csv"], "--roster is read only with --format canvas")]:
        assert cli.main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


def test_each_learner_gets_a_full_report_with_every_failure_whole(tmp_path):
    written = gradebook.write_reports(CLASS, tmp_path / "reports")
    assert sorted(p.name for p in written) == ["ada.md", "bob.md", "cmd_C_calc_A0.md"]
    ada = (tmp_path / "reports" / "ada.md").read_text(encoding="utf-8")
    assert "total: 9/11" in ada and "expected: AssertionError" in ada and "hint: a negative id" in ada
    assert ada.index("02_blocks") < ada.index("03_the_allocator")
    assert not list((tmp_path / "reports").glob(".reports.*")), "no staging folder is left behind"


def test_report_file_names_stay_inside_the_folder_and_do_not_collide(tmp_path):
    results = [result("../../etc/x", "02_blocks", {"02.1": True}, {"02.1": 4}),
               result("..__etc__x", "02_blocks", {"02.1": True}, {"02.1": 4})]
    written = gradebook.write_reports(results, tmp_path / "r")
    assert len({p.name for p in written}) == 2 and all(p.parent == tmp_path / "r" for p in written)


# ---------------------------------------------------------------------------------------
# The batch: every learner folder listed, nothing read but each learner's own regular files, bounded runs


def test_every_learner_folder_is_listed_and_links_are_refused_with_a_reason(tmp_path):
    from paged_kv_course.grading.batch import NO_NOTEBOOK, find_submissions, grade_submission

    folder = tmp_path / "class"
    for learner in ("ada", "bob", "cyd", "dee", "eve"):
        (folder / learner).mkdir(parents=True)
    (folder / "bob" / "03_the_allocator.ipynb").write_text("{}")
    (folder / "ada" / "03_the_allocator.ipynb").symlink_to(folder / "bob" / "03_the_allocator.ipynb")
    os.link(folder / "bob" / "03_the_allocator.ipynb", folder / "eve" / "03_the_allocator.ipynb")
    (folder / "dee" / "work").symlink_to(folder / "bob", target_is_directory=True)
    (folder / "fay").symlink_to(folder / "bob", target_is_directory=True)
    (folder / "gus__03_the_allocator.ipynb").symlink_to(folder / "bob" / "03_the_allocator.ipynb")
    found, warnings = find_submissions(folder)
    by_learner = {s.learner: s for s in found}
    assert sorted(by_learner) == ["ada", "bob", "cyd", "dee", "eve", "fay", "gus"], "every learner folder is listed"
    assert by_learner["cyd"].problem == NO_NOTEBOOK and by_learner["dee"].problem == NO_NOTEBOOK
    assert warnings == ["skipped dee/work: a symbolic link to a folder (not followed)"]
    assert "is a symbolic link" in by_learner["ada"].problem and "is a symbolic link" in by_learner["gus"].problem
    assert "a symbolic link to a folder" in by_learner["fay"].problem
    assert "hard link" in by_learner["eve"].problem and "hard link" in by_learner["bob"].problem
    report = grade_submission(by_learner["ada"], None, 10)
    assert report.earned == 0 and report.error == (
        "03_the_allocator.ipynb: is a symbolic link, not the learner's own file: refused, not graded")
    report = grade_submission(by_learner["cyd"], None, 10)
    assert report.error == NO_NOTEBOOK and report.tasks == []


def test_a_notebook_of_exercise_02_saved_as_03_gets_a_clear_line(tmp_path):
    from paged_kv_course.grading.batch import Submission, grade_submission

    repo = Path(__file__).resolve().parents[2]
    path = tmp_path / "ada" / "03_the_allocator.ipynb"
    path.parent.mkdir()
    path.write_bytes((repo / "exercises" / "02_blocks_and_block_tables.ipynb").read_bytes())
    report = grade_submission(Submission("ada", "03_the_allocator", path), None, 10, course=repo)
    assert report.error == ("03_the_allocator.ipynb: this is a notebook of exercise 02_blocks_and_block_tables, "
                            "not of exercise 03_the_allocator; submit your exercises/03_the_allocator.ipynb")
    assert [t.task for t in report.tasks] == ["03.1", "03.2", "03.3"] and report.earned == 0
    assert "saved under the name" not in report.error


def _demo_with(tmp_path: Path, answers: dict) -> Tuple[Path, Path]:
    """The demo course (with a hidden case of 90.1) and a learner notebook whose solution cells are ``answers``."""
    import nbformat

    from paged_kv_course.grading.notebook_tasks import cell_task, read_notebook
    from test_release import SOLVED, demo_course

    course = demo_course(tmp_path / "course")
    (course / "exercises" / "hidden").mkdir()
    (course / "exercises" / "hidden" / "90.py").write_text(
        "from paged_kv_course.grading.hidden import case\n\n\n"
        "@case('90.1', points=1, hint='try two negative numbers')\n"
        "def negatives(add):\n    assert add(-2, -3) == -5\n    print('PASSED 90.1')\n")
    nb = read_notebook(course / "exercises" / "90_demo.ipynb")
    for cell in nb.cells:
        found = cell_task(cell)
        if found and found[1] == "solution":
            cell.source = answers.get(found[0], SOLVED[found[0]])
    (tmp_path / "class" / "ada").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "class" / "ada" / "90_demo.ipynb")
    return course, tmp_path / "class" / "ada" / "90_demo.ipynb"


@pytest.fixture
def demo_checks_importable(monkeypatch):
    from test_release import FIXTURES

    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
def test_a_submission_past_its_time_bound_is_reported_as_a_timeout(tmp_path, demo_checks_importable):
    from paged_kv_course.grading.batch import Submission, grade_submission

    course, path = _demo_with(tmp_path, {"90.2": "while True:\n    pass\n"})
    started = time.monotonic()
    report = grade_submission(Submission("ada", "90_demo", path), None, 8, course=course)
    assert time.monotonic() - started < 60, "the whole run is bounded by the one limit"
    failures = {t.task: (t.earned, t.failure) for t in report.tasks}
    assert failures["90.2"][0] == 0, failures
    assert failures["90.2"][1].startswith("solution cell: timed out: the submission ran past its limit of 8 s"), failures
    assert failures["90.3"] == (0, "solution cell: not run: the submission's time ran out"), failures
    assert failures["90.1"][0] > 0, "the task before the endless loop keeps its points"
    assert all("hint" not in t.failure and "negative" not in t.failure for t in report.tasks)


@pytest.mark.slow
def test_a_syntax_error_is_reported_as_such_not_with_a_hidden_cases_hint(tmp_path, demo_checks_importable):
    from paged_kv_course.grading.batch import Submission, grade_submission

    course, path = _demo_with(tmp_path, {"90.1": "def add(a, b)\n    return a + b\n"})
    report = grade_submission(Submission("ada", "90_demo", path), None, 60, course=course)
    task = next(t for t in report.tasks if t.task == "90.1")
    assert not task.passed and "SyntaxError" in task.failure, task.failure
    assert "try two negative numbers" not in task.failure
