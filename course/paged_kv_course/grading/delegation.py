"""Delegation: one rule, read from one table of graded pieces.

A solution earns nothing for a task when its solution cell imports, or reaches by name, the
library code that implements what the task grades, or pastes it: :data:`MAX_SHARE` or more of
its own tokens (the lines the pristine cell already holds do not count) in 6-token runs shared
with the ``paged_kv_lib`` modules of that piece (:class:`TokenIndex`, the lesson gate's
measure). Calibrated on the reference solutions, which share up to 66% of their tokens with
the library's own implementation (08.1) in such runs: hence 80%, not the lesson gate's 60%,
and exact runs only (the gate's 12-token "same shape" runs put honest solutions at up to 96%). :data:`PIECES` says, per exercise (or per task ``NN.k``), which
modules implement what it grades; a package covers its submodules, and a module that no longer
exists is simply not there to import or paste. The grader reads the solution cells' text, so
the rule holds with or without a sandbox and needs nothing in the learner's kernel.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import keyword
import re
import textwrap
import tokenize
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

_BOOKS = ("paged_kv_lib.allocator", "paged_kv_lib.block_manager", "paged_kv_lib.protocols")
_SHARING = ("paged_kv_lib.prefix_cache",)  # the free queue and the invariants are in the block manager
_COURSE = ("paged_kv_course.grading", "paged_kv_course.conformance", "paged_kv_course.seed")
_LATER = tuple(f"paged_kv_course.starters.after_{n:02d}" for n in range(3, 10))

# exercise (or task) -> the modules implementing what it grades.
PIECES: Dict[str, Tuple[str, ...]] = {
    "02": (*_COURSE, *_BOOKS, *_SHARING, "paged_kv_lib.block", "paged_kv_course.starters", "paged_kv_lib.attention"),
    "03": (*_COURSE, *_BOOKS, *_SHARING, *_LATER[0:1], "paged_kv_course.starters.after_05",
           "paged_kv_course.starters.after_06"),
    "04": (*_COURSE, *_BOOKS, "paged_kv_lib.kv_cache", "paged_kv_lib.attention",
           "paged_kv_lib.viz.plots", "paged_kv_lib.viz.hash_chain", "paged_kv_lib.model"),
    "05": (*_COURSE, *_BOOKS, *_SHARING, *_LATER[2:], "paged_kv_lib.model.contiguous"),
    "06": (*_COURSE, *_BOOKS, *_SHARING, *_LATER[3:]),
    "07": (*_COURSE, *_BOOKS, "paged_kv_lib.engine", "paged_kv_lib.simulate"),
    "08": (*_COURSE, *_BOOKS, *_SHARING, "paged_kv_lib.simulate.reservation", "paged_kv_lib.simulate.metrics",
           "paged_kv_course.starters"),
    "09": (*_COURSE, "paged_kv_lib.attention.triton_kernel", "paged_kv_lib.attention.reference",
           "paged_kv_lib.attention.batched", "paged_kv_lib.attention.api"),
    # The capstone: the learner's own bookkeeping and decode attention, and not the capstone's own glue.
    "10": (*_COURSE, *_BOOKS, *_SHARING, "paged_kv_lib.attention", "paged_kv_course.starters",
           "paged_kv_course.capstone"),
}
MAX_SHARE = 0.80
EXACT_RUN, SHAPE_RUN = 6, 12
_DYNAMIC = {"exec", "eval", "compile", "__import__", "importlib", "import_module"}


def forbidden_modules(exercise: str) -> Tuple[str, ...]:
    """The modules implementing what exercise ``exercise`` ("03", "03_the_allocator" or a task "03.2") grades."""
    key = exercise[:4] if re.fullmatch(r"\d\d\.\d+", exercise[:4]) else exercise[:2]
    return PIECES.get(key, PIECES.get(key[:2], ()))


def is_forbidden(module: str, forbidden: Sequence[str]) -> bool:
    """Whether ``module`` is one of ``forbidden`` or inside one of those packages."""
    return any(module == f or module.startswith(f + ".") for f in forbidden)


def _origin(module: str, attribute: str) -> str:
    """The module that defines ``module.attribute`` (the library's own objects, imported in the judge)."""
    try:
        value = getattr(importlib.import_module(module), attribute)
    except Exception:  # noqa: BLE001 - a name that does not resolve: its dotted path is what it reaches
        return f"{module}.{attribute}"
    return getattr(value, "__name__", "") if type(value).__name__ == "module" else \
        str(getattr(value, "__module__", None) or module)


def reached(source: str, pieces: Sequence[str]) -> List[str]:
    """What a solution cell imports or names of ``pieces``, and run-time name lookups it makes."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: List[str] = []
    bound: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[(alias.asname or alias.name).split(".")[0]] = alias.asname and alias.name or \
                    alias.name.split(".")[0]
                found.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                target = _origin(node.module, alias.name) if alias.name != "*" and \
                    node.module.startswith("paged_kv_") else node.module
                found += [node.module, target]
        elif isinstance(node, ast.Attribute):
            parts, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                parts.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and bound.get(base.id, "").startswith("paged_kv_"):
                path = bound[base.id]
                for part in parts:
                    path = _origin(path, part) if importable(path) else f"{path}.{part}"
                    found.append(path)
        elif isinstance(node, ast.Name) and node.id in _DYNAMIC or \
                isinstance(node, ast.Attribute) and node.attr in ("modules", "import_module"):
            return [f"runtime:{getattr(node, 'id', getattr(node, 'attr', ''))}"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                any(is_forbidden(m, pieces) for m in re.findall(r"paged_kv_\w+(?:\.\w+)*", node.value)):
            found.append(re.findall(r"paged_kv_\w+(?:\.\w+)*", node.value)[0])
    return [m for m in dict.fromkeys(found) if is_forbidden(m, pieces)]


def importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except Exception:  # noqa: BLE001
        return False


# ---------------------------------------------------------------------------------------
# The paste measure (shared with the lesson gate, tests/exercises/test_answers_not_in_lessons.py)

Token = Tuple[int, str]
_LAYOUT = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENCODING,
           tokenize.ENDMARKER}


def tokens_of(source: str) -> List[Token]:
    """The significant tokens of ``source``: no comments, docstrings or layout; IPython magics blanked."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    raw: List[tokenize.TokenInfo] = []
    try:
        raw.extend(tokenize.generate_tokens(io.StringIO(textwrap.dedent("\n".join(lines)) + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    out: List[Token] = []
    line_start = True
    for index, tok in enumerate(raw):
        if tok.type in _LAYOUT:
            line_start = line_start or tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            continue
        if tok.type == tokenize.STRING and line_start and next(
                (t.type for t in raw[index + 1:] if t.type not in (tokenize.COMMENT, tokenize.NL)),
                tokenize.ENDMARKER) in (tokenize.NEWLINE, tokenize.ENDMARKER):
            continue  # a docstring or a bare string statement
        line_start = False
        out.append((tok.type, tok.string))
    return out


def shape_of(tok: Token) -> Token:
    """The token with identifiers, numbers and strings replaced by placeholders."""
    kind, text = tok
    if kind == tokenize.NAME and not keyword.iskeyword(text) and not keyword.issoftkeyword(text):
        return (kind, "<id>")
    return {tokenize.NUMBER: (kind, "<num>"), tokenize.STRING: (kind, "<str>")}.get(kind, tok)


class TokenIndex:
    """Every 6-token run (exact) and 12-token run (shape) of some texts, with the texts holding each."""

    def __init__(self, texts: Iterable[Sequence[Token]], exact_run: int = EXACT_RUN, shape_run: int = SHAPE_RUN):
        self.exact_run, self.shape_run = exact_run, shape_run
        self.exact: Dict[Tuple[Token, ...], Set[int]] = {}
        self.shape: Dict[Tuple[Token, ...], Set[int]] = {}
        for number, seq in enumerate(texts):
            for grams, run, s in ((self.exact, exact_run, tuple(seq)),
                                  (self.shape, shape_run, tuple(shape_of(t) for t in seq))):
                for start in range(len(s) - run + 1):
                    grams.setdefault(s[start:start + run], set()).add(number)

    def hits(self, region: Sequence[Token], allowed: Optional[Set[int]] = None) -> List[Set[int]]:
        """For each token of ``region``, the texts sharing a run that contains it."""
        out: List[Set[int]] = [set() for _ in region]
        for grams, run, seq in ((self.exact, self.exact_run, tuple(region)),
                                (self.shape, self.shape_run, tuple(shape_of(t) for t in region))):
            for start in range(len(seq) - run + 1):
                found = grams.get(seq[start:start + run])
                if found and allowed is not None:
                    found = found & allowed
                if found:
                    for i in range(start, start + run):
                        out[i] |= found
        return out

    def share(self, region: Sequence[Token]) -> float:
        """The share of ``region``'s tokens that lie in a run shared with the indexed texts."""
        return sum(1 for h in self.hits(region) if h) / len(region) if region else 0.0


def piece_sources(pieces: Sequence[str]) -> List[str]:
    """The source text of every existing module of ``pieces`` (packages with their submodules)."""
    out = []
    for name in pieces:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin)
        files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
        out += [f.read_text(encoding="utf-8") for f in files]
    return out


_INDEX: Dict[str, TokenIndex] = {}


def pasted_share(source: str, task: str, scaffold: str = "") -> float:
    """The share of a solution cell's own tokens (lines of ``scaffold``, the pristine cell, left out) lying in
    6-token runs of the library modules implementing what ``task`` grades."""
    pieces = [m for m in forbidden_modules(task) if m.startswith("paged_kv_lib")]
    key = ",".join(pieces)
    if key not in _INDEX:
        _INDEX[key] = TokenIndex((tokens_of(text) for text in piece_sources(pieces)), shape_run=10 ** 9)
    given = {line.strip() for line in scaffold.splitlines() if line.strip()}
    return _INDEX[key].share(tokens_of("\n".join(li for li in source.splitlines() if li.strip() not in given)))


def delegation_line(task: str, source: str, scaffold: str = "") -> str:
    """The one line that zeroes ``task`` for this solution cell, or '' when the cell does its own work."""
    pieces = forbidden_modules(task)
    names = reached(source, pieces)
    if names and names[0].startswith("runtime:"):
        return (f"delegation: task {task} earns 0: its solution cell looks code up by a name built at run time "
                f"({names[0][8:]}), so the grader cannot tell that it does not use the library's answer")
    if names:
        return (f"delegation: task {task} earns 0: its solution cell uses {names[0]}, the library's "
                "implementation of what this task grades")
    share = pasted_share(source, task, scaffold)
    if share >= MAX_SHARE:
        return (f"delegation: task {task} earns 0: {share:.0%} of its solution cell is pasted from the library's "
                f"implementation of what this task grades (the limit is {MAX_SHARE:.0%})")
    return ""


def delegation_lines(task_sources: Mapping[str, Tuple[str, str]]) -> Dict[str, str]:
    """``task -> line`` for every task whose solution cell (source, pristine scaffold) delegates."""
    return {task: line for task, (source, scaffold) in task_sources.items()
            if (line := delegation_line(task, source, scaffold))}
