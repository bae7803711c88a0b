"""Generate the learner versions of the exercises from their solution notebooks.

``python -m paged_kv_course.grading.generate`` reads every ``exercises/solutions/NN_*.ipynb``,
checks it against the conventions (see :mod:`.notebook_tasks`) and writes
``exercises/NN_*.ipynb``: solution regions become ``raise NotImplementedError(...)``,
solution and check cells lose their outputs (a learner version opens clean: nothing
claims ``PASSED`` before the learner has written anything), and the first markdown cell
gets the short "how to work here" note (how to run a check, how to grade the notebook)
unless it already has one. ``--check`` writes nothing and exits 1 when a committed
learner version differs from a fresh generation (a CI gate).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from nbformat import NotebookNode

from .notebook_tasks import (
    META_KEY,
    ROLE_CHECK,
    ROLE_SOLUTION,
    ExerciseSpecError,
    NotebookFormatError,
    cell_task,
    notebook_to_text,
    read_notebook,
    strip_solutions,
    validate_solution_notebook,
)

COURSE_ROOT = Path(__file__).resolve().parents[3]
SOLUTION_GLOB = "[0-9][0-9]_*.ipynb"
HOWTO_MARK = "**How to work here.**"
HOWTO = (
    HOWTO_MARK + " Write your code in each task's solution cell, where it says "
    "`raise NotImplementedError`, and run that cell. Then run the check cell right after it: it "
    "prints `PASSED {first}` (for task {first}) when your code is right, `task {first} is not written yet` "
    "before you start, or the call that went wrong with what was expected, what came back and a hint.\n\n"
    "**To grade the whole notebook**, save it and run `paged-kv grade exercises/{stem}.ipynb` in a terminal "
    "from the course folder. Only your solution cells count: the grader runs the checks again, outside your "
    "notebook, and tells you about code it did not grade."
)


def howto_text(stem: str, first_task: str) -> str:
    """The note the first cell of every learner version carries."""
    return HOWTO.format(stem=stem, first=first_task)


def make_learner_version(solution: NotebookNode, name: str) -> NotebookNode:
    """The learner version of a validated solution notebook (a new notebook; the input is untouched).

    Solution and check cells become undeletable in JupyterLab (``deletable: false``),
    check cells also read-only, so the task metadata the grader relies on survives.
    """
    validate_solution_notebook(solution, name)
    learner = copy.deepcopy(solution)
    for cell in learner.cells:
        if cell.cell_type == "markdown":
            cell.source = relocate_links(cell.source)
        found = cell_task(cell)
        if found is None:
            continue
        task, role = found
        if role == ROLE_SOLUTION:
            cell.source = strip_solutions(cell.source, task)
            cell.outputs = []
            cell.execution_count = None
            cell.metadata["deletable"] = False
        elif role == ROLE_CHECK:
            cell.outputs = []
            cell.execution_count = None
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
    stem = Path(name).stem
    add_howto(learner, stem)
    learner.metadata[META_KEY] = {
        "exercise": stem,
        "generated_from": f"exercises/solutions/{stem}.ipynb",
    }
    return learner


def add_howto(nb: NotebookNode, stem: str) -> None:
    """Put the "how to work here" note at the end of the first cell (a markdown cell; one is added
    at the top when the notebook starts with code), unless the notebook already says it there."""
    tasks = [cell_task(c) for c in nb.cells]
    first_task = next((t[0] for t in tasks if t is not None), f"{stem[:2]}.1")
    if nb.cells and nb.cells[0].cell_type == "markdown":
        first = nb.cells[0]
        if HOWTO_MARK not in first.source:
            first.source = first.source.rstrip("\n") + "\n\n" + howto_text(stem, first_task)
        return
    from nbformat.v4 import new_markdown_cell

    cell = new_markdown_cell(howto_text(stem, first_task))
    cell["id"] = "paged-kv-howto"
    nb.cells.insert(0, cell)


def relocate_links(markdown: str) -> str:
    """Relative links written from ``exercises/solutions/`` made right for ``exercises/``.

    The learner version sits one folder up from its source, so ``../../lessons/x`` must
    become ``../lessons/x``.
    """
    return markdown.replace("](../../", "](../")


def learner_text(solution_path: Path) -> str:
    """The exact text of the learner version of one solution notebook."""
    solution = read_notebook(solution_path)
    return notebook_to_text(make_learner_version(solution, solution_path.name))


def solution_paths(solutions_dir: Path) -> List[Path]:
    """The solution notebooks of a folder, sorted by name."""
    return sorted(p for p in solutions_dir.glob(SOLUTION_GLOB) if p.is_file())


def generate(solutions_dir: Path, out_dir: Path, check: bool = False, learner_work: bool = False) -> List[Path]:
    """Write (or, with ``check``, only compare) every learner version; return the stale paths.

    Every solution notebook is validated first; problems in any of them raise one
    :class:`ExerciseSpecError` naming all of them, before anything is written. With
    ``learner_work`` (a learner's fork, see :mod:`.learner_work`) a learner version that is
    the fresh one plus a learner's work counts as up to date, and is never overwritten.
    """
    texts = {}
    errors = []
    for path in solution_paths(solutions_dir):
        try:
            texts[out_dir / path.name] = learner_text(path)
        except (ExerciseSpecError, NotebookFormatError) as exc:
            errors.append(str(exc))
    if errors:
        raise ExerciseSpecError("\n".join(errors))
    stale = []
    for target, text in texts.items():
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current != text:
            if learner_work and current is not None and _is_learner_work(current, text, target):
                continue
            stale.append(target)
            if not check:
                target.write_text(text, encoding="utf-8")
    if check:
        generated = {p.name for p in texts}
        stale.extend(
            p for p in sorted(out_dir.glob(SOLUTION_GLOB)) if p.is_file() and p.name not in generated
        )
    return stale


def _is_learner_work(current: str, fresh: str, target: Path) -> bool:
    from .learner_work import learner_work_problems
    from .notebook_tasks import notebook_from_text

    try:
        return not learner_work_problems(notebook_from_text(current, str(target)), notebook_from_text(fresh))
    except NotebookFormatError:
        return False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m paged_kv_course.grading.generate",
        description="Write exercises/NN_*.ipynb (learner versions) from exercises/solutions/NN_*.ipynb.",
    )
    parser.add_argument(
        "--solutions", type=Path, default=COURSE_ROOT / "exercises" / "solutions",
        help="folder of solution notebooks (default: the course's exercises/solutions)",
    )
    parser.add_argument(
        "--out", type=Path, default=None,
        help="folder for the learner versions (default: the parent of --solutions)",
    )
    parser.add_argument(
        "--check", action="store_true",
        help="write nothing; exit 1 listing learner versions that differ from a fresh generation",
    )
    parser.add_argument(
        "--learner-fork", action="store_true", default=None,
        help="a learner's fork: a learner version holding the learner's work counts as up to date "
             "(default: PAGED_KV_LEARNER_FORK=true in the environment)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    solutions_dir: Path = args.solutions
    out_dir: Path = args.out or solutions_dir.parent
    if not solutions_dir.is_dir():
        print(f"error: no such folder: {solutions_dir}", file=sys.stderr)
        return 2
    try:
        from .learner_work import in_learner_fork

        fork = in_learner_fork() if args.learner_fork is None else args.learner_fork
        stale = generate(solutions_dir, out_dir, check=args.check, learner_work=fork)
    except ExerciseSpecError as exc:
        print(f"error: solution notebooks break the exercise conventions:\n{exc}", file=sys.stderr)
        return 2
    count = len(solution_paths(solutions_dir))
    if args.check:
        if stale:
            print("stale learner versions (run `make exercises` and commit them):", file=sys.stderr)
            for path in stale:
                print(f"  {path}", file=sys.stderr)
            return 1
        print(f"{count} learner version(s) up to date")
        return 0
    for path in stale:
        print(f"wrote {path}")
    print(f"{count} learner version(s) generated, {len(stale)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
