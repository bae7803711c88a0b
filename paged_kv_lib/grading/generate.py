"""Generate the learner versions of the exercises from their solution notebooks.

``python -m paged_kv_lib.grading.generate`` reads every ``exercises/solutions/NN_*.ipynb``,
checks it against the conventions (see :mod:`.notebook_tasks`) and writes
``exercises/NN_*.ipynb``: solution regions become ``raise NotImplementedError(...)``,
solution cells lose their outputs, check cells keep their stored ``PASSED NN.k`` line
(so nbval fails them until the learner's code works). ``--check`` writes nothing and
exits 1 when a committed learner version differs from a fresh generation (a CI gate).
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

COURSE_ROOT = Path(__file__).resolve().parents[2]
SOLUTION_GLOB = "[0-9][0-9]_*.ipynb"


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
            cell.metadata["deletable"] = False
            cell.metadata["editable"] = False
    stem = Path(name).stem
    learner.metadata[META_KEY] = {
        "exercise": stem,
        "generated_from": f"exercises/solutions/{stem}.ipynb",
    }
    return learner


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


def generate(solutions_dir: Path, out_dir: Path, check: bool = False) -> List[Path]:
    """Write (or, with ``check``, only compare) every learner version; return the stale paths.

    Every solution notebook is validated first; problems in any of them raise one
    :class:`ExerciseSpecError` naming all of them, before anything is written.
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
            stale.append(target)
            if not check:
                target.write_text(text, encoding="utf-8")
    if check:
        generated = {p.name for p in texts}
        stale.extend(
            p for p in sorted(out_dir.glob(SOLUTION_GLOB)) if p.is_file() and p.name not in generated
        )
    return stale


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m paged_kv_lib.grading.generate",
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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    solutions_dir: Path = args.solutions
    out_dir: Path = args.out or solutions_dir.parent
    if not solutions_dir.is_dir():
        print(f"error: no such folder: {solutions_dir}", file=sys.stderr)
        return 2
    try:
        stale = generate(solutions_dir, out_dir, check=args.check)
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
