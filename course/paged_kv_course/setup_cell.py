"""Make the first code cell of each notebook the course's setup cell (its Colab block on top).

On Google Colab a notebook opens alone, without the course installed. The block this script
writes at the top of a notebook's first code cell runs only there (``google.colab`` is in
``sys.modules``): it clones the course and installs it when ``paged_kv_lib`` is missing,
enables Colab's custom widget manager and changes to the notebook's folder in the course.
Everywhere else it does nothing. The notebook's own setup code stays below it in that cell.

    python scripts/setup_cell.py NOTEBOOK.ipynb [...]            write or refresh the block
    python scripts/setup_cell.py --check NOTEBOOK.ipynb [...]    exit 1 naming each notebook without it
    python scripts/setup_cell.py --repo-url URL NOTEBOOK.ipynb   use URL instead of the package's

(``scripts/setup_cell.py`` runs this module's :func:`main`; the code lives in the package so that
``paged-kv release --repo-url URL`` can write the block into a release.)

Writing is idempotent: a block already there is replaced, nothing else changes. The
repository URL comes from ``pyproject.toml``'s ``[project.urls] Repository`` (or the
installed package's metadata); ``paged-kv release --repo-url URL`` calls
:func:`setup_cell_source` (or :func:`apply`) with its own. The URL the course ships with is
:data:`PLACEHOLDER_URL`, which names no published course: a block that clones it says so on
the line above, so whoever copies it knows to put their own repository there.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import nbformat

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package runs from one
BEGIN = "# Colab only (elsewhere this block does nothing): install the course, enable its widgets, open its folder."
END = "# End of the Colab block; this notebook's own setup follows."
_URL_LINE = re.compile(r'^    COURSE_REPO = "([^"]+)"$', re.MULTILINE)
# Where a Colab runtime keeps the course: its working folder is /content.
COLAB_CHECKOUT = "/content/paged-kv"
# The repository URL pyproject.toml ships with. A placeholder: no course is published there. A
# course's own repository puts its URL in pyproject.toml; a class release passes --repo-url.
PLACEHOLDER_URL = "https://github.com/paged-kv/paged-kv"
PLACEHOLDER_NOTE = "    # A placeholder: replace it with the URL of the repository this notebook came from."


class SetupCellError(ValueError):
    """A notebook or URL the setup cell cannot be written for (one line for the command to print)."""


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The course's repository URL: ``[project.urls] Repository`` of ``pyproject``, else the
    installed package's ``Project-URL`` metadata."""
    if pyproject.is_file():
        try:
            import tomllib  # Python 3.11+
        except ImportError:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        urls = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("urls", {})
        if urls.get("Repository"):
            return str(urls["Repository"])
    from importlib import metadata

    for entry in metadata.metadata("paged-kv").get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip() == "Repository":
            return url.strip()
    raise SetupCellError(f"{pyproject}: no [project.urls] Repository, and the installed package names none")


def check_url(repo_url: str) -> str:
    """``repo_url`` if it is an https:// or git@ URL that a notebook line can quote; else SetupCellError."""
    if not isinstance(repo_url, str) or not re.fullmatch(r"(https://|git@)[^\s\"'\\]+", repo_url):
        raise SetupCellError(f"repo_url {repo_url!r}: expected an https:// or git@ URL without quotes or spaces")
    return repo_url


def setup_cell_source(repo_url: str, folder: str = "lessons") -> str:
    """The Colab block for a notebook in ``folder`` (relative to the course root, e.g.
    ``"lessons"`` or ``"exercises"``), cloning ``repo_url`` when the course is missing."""
    check_url(repo_url)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", folder) or ".." in folder.split("/"):
        raise SetupCellError(f"folder {folder!r}: expected a path inside the course, such as 'lessons'")
    parts = ", ".join(f'"{p}"' for p in folder.split("/"))
    return "\n".join([
        BEGIN,
        "import sys",
        "",
        'if "google.colab" in sys.modules:',
        "    import importlib.util",
        "    import os",
        "    import subprocess",
        "",
        *([PLACEHOLDER_NOTE] if repo_url == PLACEHOLDER_URL else []),
        f'    COURSE_REPO = "{repo_url}"',
        '    if importlib.util.find_spec("paged_kv_course") is None:',
        f'        if not os.path.isdir("{COLAB_CHECKOUT}"):',
        f'            subprocess.run(["git", "clone", "--depth=1", COURSE_REPO, "{COLAB_CHECKOUT}"], check=True)',
        "        # Colab's torch, triton and ipywidgets 7.7 satisfy the course: pip adds only what is missing.",
        "        subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"--quiet\",",
        f'                        "-e", "{COLAB_CHECKOUT}", "-e", "{COLAB_CHECKOUT}/course"], check=True)',
        "        # This kernel started before the install: the library and the course package, by hand.",
        f'        sys.path[:0] = ["{COLAB_CHECKOUT}", "{COLAB_CHECKOUT}/course"]',
        "    import paged_kv_lib",
        "    from google.colab import output",
        "",
        "    output.enable_custom_widget_manager()",
        f"    os.chdir(os.path.join(os.path.dirname(os.path.dirname(paged_kv_lib.__file__)), {parts}))",
        END,
    ])


def _folder_of(path: Path) -> str:
    """The notebook's folder relative to the course root (the folder above ``paged_kv_lib/``).

    A solution notebook, and a released course's untouched copy in ``exercises/pristine/``, get the
    learner version's folder, ``exercises``: the learner version is generated from the solution,
    block included, the pristine copy equals it, and learners open it there."""
    here = path.resolve().parent
    for root in (here, *here.parents):
        if (root / "paged_kv_lib").is_dir():
            folder = here.relative_to(root).as_posix() or "."
            return "exercises" if folder in ("exercises/solutions", "exercises/pristine") else folder
    raise SetupCellError(f"{path}: not inside the course (no paged_kv_lib/ in any folder above it)")


def _first_code_cell(nb: nbformat.NotebookNode, path: Path) -> nbformat.NotebookNode:
    for cell in nb.cells:
        if cell.cell_type == "code":
            return cell
    raise SetupCellError(f"{path}: has no code cell to hold the setup")


def split_block(source: str) -> tuple[Optional[str], str]:
    """``(block, rest)``: the Colab block at the top of ``source`` (None if there is none) and
    the cell's own code below it."""
    if not source.startswith(BEGIN):
        return None, source
    end = source.find("\n" + END)
    if end < 0:
        return None, source
    stop = end + 1 + len(END)
    return source[:stop], source[stop:].lstrip("\n")


def apply(path: Path, repo_url: str) -> bool:
    """Write or refresh the block in ``path``'s first code cell; True if the file changed."""
    nb = nbformat.read(path, as_version=4)
    cell = _first_code_cell(nb, path)
    block = setup_cell_source(repo_url, _folder_of(path))
    _, rest = split_block(cell.source)
    new = block + ("\n\n" + rest if rest else "")
    if new == cell.source:
        return False
    cell.source = new
    nbformat.write(nb, path)
    return True


def check(path: Path) -> Optional[str]:
    """None if ``path``'s first code cell opens with a current block, else why not (one line)."""
    nb = nbformat.read(path, as_version=4)
    try:
        cell = _first_code_cell(nb, path)
    except SetupCellError as exc:
        return str(exc)
    block, _ = split_block(cell.source)
    if block is None:
        return f"{path}: the first code cell does not open with the Colab setup block (run scripts/setup_cell.py)"
    found = _URL_LINE.search(block)
    if not found:
        return f"{path}: the Colab setup block names no COURSE_REPO"
    if block != setup_cell_source(found.group(1), _folder_of(path)):
        return f"{path}: the Colab setup block differs from what scripts/setup_cell.py writes (run it again)"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook lacks the block")
    parser.add_argument("--repo-url", default=None, help="default: [project.urls] Repository in pyproject.toml")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems: List[str] = [p for p in map(check, args.notebooks) if p]
            for line in problems:
                print(line, file=sys.stderr)
            return 1 if problems else 0
        url = args.repo_url or repository_url()
        for path in args.notebooks:
            print(f"{path}: {'written' if apply(path, url) else 'already current'}")
    except SetupCellError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
