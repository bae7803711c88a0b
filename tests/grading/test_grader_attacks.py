"""A learner out for free points: each attack from issue 15 must earn nothing it did not solve.

The attacks run against a throwaway copy of the demo course (``tests/fixtures/grading``):
its exercise, its solutions and its check module live in a temporary folder, so an
attack that got through could damage only that copy. Each attack is graded alone and
inside one batch with honest learners; the honest learners' scores must not move, and
no file outside the attacker's own working folder may change.

Attacks that only the sandbox stops (reading the solutions, writing the course's files,
a process that outlives the kernel, other submissions' folders) need bubblewrap; the
others are stopped by the judge alone and are also run without the sandbox.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

import nbformat
import pytest

from paged_kv_course.grading import batch, grader, sandbox
from paged_kv_course.grading.notebook_tasks import cell_task, read_notebook, split_points

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "grading"
TIMEOUT = 10  # seconds for a whole submission, kernel start included (two attacks wait it out)
POINTS = {"90.1": 2, "90.2": 1, "90.3": 3}

ADD_OK = "def add(a, b):\n    return a + b\n"
COUNTER_OK = (
    "class Counter:\n    def __init__(self):\n        self.count = 0\n\n"
    "    def bump(self):\n        self.count += 1\n        return self.count\n"
)
BLOCKS_OK = "def blocks_needed(num_tokens, block_size):\n    return -(-num_tokens // block_size)\n"
BLOCKS_FLOOR = "def blocks_needed(num_tokens, block_size):\n    return num_tokens // block_size\n"

NEEDS_BWRAP = pytest.mark.skipif(bool(sandbox.bwrap_problem()), reason=f"no sandbox: {sandbox.bwrap_problem()}")


def attacks(course: Path, gradebook: Path) -> Dict[str, Dict[str, str]]:
    """Attack name -> solution-cell sources (by task); none of them solves a task honestly."""
    solutions = course / "exercises" / "solutions"
    return {
        "exec_reference_solution": {"90.1": (
            "import glob, json\n"
            "def add(a, b):\n    raise NotImplementedError\n"
            f"for path in glob.glob({str(course)!r} + '/**/*.ipynb', recursive=True):\n"
            "    for cell in json.load(open(path))['cells']:\n"
            "        text = ''.join(cell['source'])\n"
            "        if 'BEGIN SOLUTION' in text:\n"
            "            exec(text, globals())\n"
        )},
        "replace_check_functions": {"90.1": (
            "import demo_checks, sys\n"
            "for name in dir(demo_checks):\n"
            "    if name.startswith(('check_', '_expect')):\n"
            "        setattr(demo_checks, name, lambda *a, **k: print('PASSED 90.1\\nPASSED 90.2\\nPASSED 90.3'))\n"
            "sys.modules['demo_checks'] = demo_checks\n"
            "def add(a, b):\n    return 0\n"
        )},
        "custom_exc_and_input_transformer": {"90.1": (
            "ip = get_ipython()\n"
            "ip.set_custom_exc((BaseException,), lambda *a, **k: print('PASSED 90.1'))\n"
            "ip.input_transformers_post.append(lambda lines: ['print(\"PASSED 90.1\")\\n'])\n"
            "def add(a, b):\n    raise NotImplementedError\n"
        )},
        "int_equal_to_everything": {
            "90.1": (
                "class Anything(int):\n"
                "    def __eq__(self, other):\n        return True\n"
                "    def __ne__(self, other):\n        return False\n"
                "    __hash__ = int.__hash__\n"
                "def add(a, b):\n    return Anything(0)\n"
            ),
            "90.2": (
                "class Counter:\n    def __init__(self):\n        self.count = Anything(0)\n"
                "    def bump(self):\n        return Anything(0)\n"
            ),
            "90.3": "def blocks_needed(num_tokens, block_size):\n    return Anything(0)\n",
        },
        "read_the_checkers_frame": {"90.1": (
            "import sys\n"
            "def add(a, b):\n"
            "    frame = sys._getframe(1)\n"
            "    while frame is not None:\n"
            "        for key in ('expected', 'want', 'a'):\n"
            "            if key in frame.f_locals and key != 'a':\n"
            "                return frame.f_locals[key]\n"
            "        frame = frame.f_back\n"
            "    return None\n"
        )},
        "tamper_with_course_files": {"90.1": (
            "import demo_checks, glob\n"
            "open(demo_checks.__file__, 'a').write('\\ndef check_add(f):\\n    print(\"PASSED 90.1\")\\n'"
            "'\\ndef check_counter(f):\\n    print(\"PASSED 90.2\")\\n'"
            "'\\ndef check_blocks(f):\\n    print(\"PASSED 90.3\")\\n'"
            "'\\ndef check_blocks_zero(f):\\n    print(\"PASSED 90.3\")\\n')\n"
            f"for path in glob.glob({str(solutions)!r} + '/*.ipynb') + glob.glob({str(course)!r} + '/exercises/*.ipynb'):\n"
            "    text = open(path).read().replace('check_add(add)', 'print(\\\\\"PASSED 90.1\\\\\")')\n"
            "    open(path, 'w').write(text)\n"
            "def add(a, b):\n    raise NotImplementedError\n"
        )},
        "detached_process_rewrites_the_gradebook": {"90.1": (
            "import os, sys, subprocess\n"
            f"target = {str(gradebook)!r}\n"
            "code = ('import time, os\\ntime.sleep(4)\\n'\n"
            "        f'open({target!r}, \"w\").write(\"learner,notebook,task,points,passed,earned\\\\nmallory,90_demo,90.1,2,1,2\\\\n\")\\n'\n"
            "        f'[open(os.path.join(d, \"report.json\"), \"w\").write(\"{{}}\") for d in os.listdir(\"/tmp\")]')\n"
            "subprocess.Popen([sys.executable, '-c', code], start_new_session=True,\n"
            "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "def add(a, b):\n    raise NotImplementedError\n"
        )},
        "other_submissions": {"90.1": (
            "import glob, os\n"
            f"roots = ['/tmp', {str(course.parent)!r}]\n"
            "for root in roots:\n"
            "    for path in glob.glob(root + '/**/*.ipynb', recursive=True):\n"
            "        try:\n"
            "            text = open(path).read()\n"
            "            open(path, 'w').write(text.replace('return a + b', 'return a - b'))\n"
            "        except OSError:\n"
            "            pass\n"
            "def add(a, b):\n    raise NotImplementedError\n"
        )},
        # Issue 23 and 32: replies that would have run code in the judge, or rebuilt a class there.
        "forged_reply_names_a_class": {"90.1": (
            "import gc\n"
            "wire = next(m for m in gc.get_objects() if type(m).__name__ == 'module'\n"
            "            and getattr(m, '__name__', '') == 'paged_kv_wire')\n"
            "real = wire.send\n"
            "gadgets = [{'o': ['paged_kv_course.grading.wire', 'Decoder', []]},\n"
            "           {'o': ['paged_kv_lib.block', 'Block', [['block_id', 0]]]},\n"
            "           {'e': ['tempfile', '_TemporaryFileCloser', 'x']}, {'h': [1, 'int']}, {'a': [['x', 3]]}]\n"
            "count = [0]\n"
            "def forged(fd, document, blobs):\n"
            "    if isinstance(document, dict) and document.get('ok') is not None:\n"
            "        count[0] += 1\n"
            "        document = {'ok': gadgets[count[0] % len(gadgets)]}\n"
            "    return real(fd, document, blobs)\n"
            "wire.send = forged\n"
            "def add(a, b):\n    return a + b\n"
        ), "90.2": COUNTER_OK, "90.3": BLOCKS_OK},
        "pickle_reply_with_a_global": {"90.1": (
            "import gc, os, pickle, struct\n"
            "wire = next(m for m in gc.get_objects() if type(m).__name__ == 'module'\n"
            "            and getattr(m, '__name__', '') == 'paged_kv_wire')\n"
            "class Boom:\n"
            "    def __reduce__(self):\n        return (os.system, ('touch /tmp/paged_kv_pwned',))\n"
            "def send(fd, document, blobs):\n"
            "    payload = pickle.dumps(('ok', Boom(), []))\n"
            "    os.write(fd, struct.pack('!QI', len(payload), len(payload)) + payload)\n"
            "wire.send = send\n"
            "def add(a, b):\n    return a + b\n"
        )},
        "colliding_set_and_deep_reply": {
            "90.1": "def add(a, b):\n    return {k * (2 ** 61 - 1) for k in range(1, 60000)}\n",
            "90.3": (
                "def blocks_needed(num_tokens, block_size):\n"
                "    value = []\n"
                "    for _ in range(5000):\n"
                "        value = [value]\n"
                "    return value\n"
            ),
        },
        "reply_over_the_size_limit": {"90.1": (
            "def add(a, b):\n    return b'x' * (257 * 1024 * 1024)\n"
        )},
        "lying_frame_header": {"90.1": (
            "import gc, os, struct\n"
            "wire = next(m for m in gc.get_objects() if type(m).__name__ == 'module'\n"
            "            and getattr(m, '__name__', '') == 'paged_kv_wire')\n"
            "def send(fd, document, blobs):\n"
            "    os.write(fd, struct.pack('!QI', 2 ** 60, 4))\n"
            "wire.send = send\n"
            "def add(a, b):\n    return a + b\n"
        )},
        # Issue 23: what the kernel of a root grader could do to the machine.
        "escape_the_sandbox_as_root": {"90.1": (
            "import ctypes, glob, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for target in (b'/home/learner', b'/opt/paged-kv', b'/'):\n"
            "    libc.umount2(target, 2)\n"
            "libc.mount(b'none', b'/', None, 32 | 16384, None)  # remount read-write\n"
            f"checkout = {str(Path(__file__).resolve().parents[2])!r}\n"
            "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]\n"
            "mounts = open('/proc/self/mountinfo').read()\n"
            f"seen = [p for p in (checkout + '/.git', checkout + '/tests', {str(solutions)!r}) if os.path.exists(p)]\n"
            "escaped = int(caps, 16) != 0 or bool(seen) or '/class/' in mounts\n"
            "places = ['/home', '/tmp', '/opt', '/root', '/work', '/mnt', '/srv']\n"
            "for path in [p for place in places for p in glob.glob(place + '/**/*.ipynb', recursive=True)]:\n"
            "    try:\n"
            "        open(path, 'a').write(' ')\n"
            "    except OSError:\n"
            "        pass\n"
            "def add(a, b):\n"
            "    if escaped:\n        return a + b\n"
            "    raise NotImplementedError\n"
        )},
        "fork_bomb": {"90.1": (
            "import os, time\n"
            "children = 0\n"
            "for _ in range(300):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60)\n"
            "            os._exit(0)\n"
            "        children += 1\n"
            "    except OSError:\n"
            "        break\n"
            "def add(a, b):\n"
            "    if children >= 300:\n        return a + b  # nothing held the process count\n"
            "    raise NotImplementedError\n"
        )},
    }


SANDBOX_ONLY = {"exec_reference_solution", "tamper_with_course_files", "detached_process_rewrites_the_gradebook",
                "other_submissions", "escape_the_sandbox_as_root", "fork_bomb"}


@pytest.fixture()
def course(tmp_path, monkeypatch):
    """A throwaway course: exercises/, exercises/solutions/ and the check module on the path."""
    root = tmp_path / "course"
    (root / "exercises" / "solutions").mkdir(parents=True)
    shutil.copy(FIXTURES / "solutions" / "90_demo.ipynb", root / "exercises" / "solutions")
    shutil.copy(FIXTURES / "90_demo.ipynb", root / "exercises")
    (root / "checks").mkdir()
    shutil.copy(FIXTURES / "demo_checks.py", root / "checks")
    monkeypatch.syspath_prepend(str(root / "checks"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root / "checks"), os.environ.get("PYTHONPATH", "")]))
    return root


def submission(course: Path, sources: Dict[str, str]) -> nbformat.NotebookNode:
    nb = read_notebook(course / "exercises" / "90_demo.ipynb")
    for cell in nb.cells:
        found = cell_task(cell)
        if found and found[1] == "solution" and found[0] in sources:
            cell.source = sources[found[0]]
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def fingerprint(folder: Path) -> Dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def earned(report) -> Dict[str, float]:
    return {t.task: t.earned for t in report.tasks}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["auto", "none"])
def test_attacks_stopped_by_the_judge_earn_nothing_alone(course, tmp_path, mode):
    if mode == "auto" and sandbox.bwrap_problem():
        pytest.skip(sandbox.bwrap_problem())
    for name, sources in attacks(course, tmp_path / "gradebook.csv").items():
        if name in SANDBOX_ONLY:
            continue
        path = write(submission(course, sources), tmp_path / name / "90_demo.ipynb")
        report = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT, sandbox_mode=mode)
        assert not report.error, (name, report.error)
        assert earned(report) == {"90.1": 0, "90.2": 0, "90.3": 0}, (name, [(t.task, t.failure) for t in report.tasks])
        if mode == "none":
            assert report.notes[0].startswith("grading was not isolated"), report.notes
            assert len(report.notes[0].splitlines()) == 1


@NEEDS_BWRAP
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_attacks_stopped_by_the_sandbox_earn_nothing_alone_and_change_no_file(course, tmp_path):
    before = fingerprint(course)
    gradebook = tmp_path / "gradebook.csv"
    gradebook.write_text("the grader's own file\n")
    for name, sources in attacks(course, gradebook).items():
        if name not in SANDBOX_ONLY:
            continue
        path = write(submission(course, sources), tmp_path / name / "90_demo.ipynb")
        report = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT)
        assert not report.error, (name, report.error)
        assert not any("not isolated" in n for n in report.notes)
        assert earned(report) == {"90.1": 0, "90.2": 0, "90.3": 0}, (name, [(t.task, t.failure) for t in report.tasks])
    time.sleep(6)  # longer than the detached process waits
    assert fingerprint(course) == before, "an attack changed the course's files"
    assert gradebook.read_text() == "the grader's own file\n"


@NEEDS_BWRAP
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_class_with_every_attack_grades_the_honest_learners_unchanged(course, tmp_path, capsys):
    from paged_kv_lib import cli

    folder = tmp_path / "class"
    gradebook = tmp_path / "out" / "gradebook.csv"
    for name, sources in attacks(course, gradebook).items():
        write(submission(course, sources), folder / f"x_{name}" / "90_demo.ipynb")
    honest = write(submission(course, {"90.1": ADD_OK, "90.2": COUNTER_OK, "90.3": BLOCKS_OK}),
                   folder / "ana" / "90_demo.ipynb")
    partial = write(submission(course, {"90.1": ADD_OK, "90.3": BLOCKS_FLOOR}), folder / "bo__90_demo.ipynb")
    untouched = write(submission(course, {}), folder / "cy" / "90_demo.ipynb")
    sub_before = {p: p.read_bytes() for p in (honest, partial, untouched)}
    course_before = fingerprint(course)
    code = cli.main(["grade", "--batch", str(folder), "--csv", str(gradebook), "--course", str(course),
                     "--timeout", str(TIMEOUT), "--jobs", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    time.sleep(6)
    with open(gradebook, newline="") as handle:
        rows = list(csv.DictReader(handle))
    scores: Dict[str, Dict[str, int]] = {}
    for row in rows:
        scores.setdefault(row["learner"], {})[row["task"]] = int(row["earned"])
    assert scores["ana"] == POINTS
    floor = {"90.1": 2, "90.2": 0, "90.3": split_points(POINTS["90.3"], [None, None])[1]}  # check_blocks_zero's share
    assert scores["bo"] == floor
    assert scores["cy"] == {"90.1": 0, "90.2": 0, "90.3": 0}
    for name in attacks(course, gradebook):
        assert scores[f"x_{name}"] == {"90.1": 0, "90.2": 0, "90.3": 0}, (name, [r for r in rows if r["learner"] == f"x_{name}"])
    assert {p: p.read_bytes() for p in sub_before} == sub_before, "a submission was changed by another"
    assert fingerprint(course) == course_before
    # The same honest notebooks graded alone score the same.
    for path, want in [(honest, POINTS), (partial, floor)]:
        alone = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT)
        assert earned(alone) == want


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_correct_submission_still_gets_full_marks_and_the_untouched_version_zero(course, tmp_path):
    for mode in ("auto", "none"):
        right = write(submission(course, {"90.1": ADD_OK, "90.2": COUNTER_OK, "90.3": BLOCKS_OK}), tmp_path / mode / "90_demo.ipynb")
        assert earned(grader.grade_notebook(right, course=course, sandbox_mode=mode)) == POINTS
    report = grader.grade_notebook(course / "exercises" / "90_demo.ipynb", course=course)
    assert earned(report) == {"90.1": 0, "90.2": 0, "90.3": 0}
    assert [t.failure for t in report.tasks] == [f"task {t} is not written yet" for t in POINTS]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_attacks_on_a_real_exercise_earn_nothing(tmp_path):
    """Exercise 02, as in the issue: replacing the course's check functions, an int equal to
    everything, and reading the solutions from the checkout."""
    repo = Path(__file__).resolve().parents[2]
    learner = repo / "exercises" / "02_blocks_and_block_tables.ipynb"
    if not learner.is_file():
        pytest.skip("no exercise 02")
    nb = read_notebook(learner)
    first = next(cell for cell in nb.cells if cell_task(cell) and cell_task(cell)[1] == "solution")
    original = first.source
    assert grader._defined_names(original), "the first task defines a function to attack"
    first.source = (
        "import glob, json, paged_kv_course.grading as grading\n"
        "for name in list(grading.__all__):\n"
        "    if name.startswith('check_'):\n"
        "        setattr(grading, name, lambda *a, **k: print('PASSED 02.1'))\n"
        f"for path in glob.glob({str(repo)!r} + '/exercises/solutions/*.ipynb'):\n"
        "    for cell in json.load(open(path))['cells']:\n"
        "        text = ''.join(cell['source'])\n"
        "        if 'BEGIN SOLUTION' in text and cell['cell_type'] == 'code':\n"
        "            try:\n"
        "                exec(text, globals())\n"
        "            except Exception:\n"
        "                pass\n"
        "class Anything(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = int.__hash__\n"
    ) + "".join(f"def {name}(*args, **kwargs):\n    return Anything(0)\n"
                for name in sorted(grader._defined_names(original)))
    path = write(nb, tmp_path / "02_blocks_and_block_tables.ipynb")
    report = grader.grade_notebook(path, course=repo, cell_timeout=60)
    assert not report.error, report.error
    solved = [t.task for t in report.tasks if t.passed]
    if sandbox.bwrap_problem():
        pytest.skip("without the sandbox the solutions can be read (documented)")
    assert solved == [], [(t.task, t.failure) for t in report.tasks]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_the_sandbox_a_batch_flags_grades_after_the_course_changed(course, tmp_path):
    """--sandbox none cannot stop a submission from rewriting the exercises; the batch notices and
    flags every grade from then on."""
    folder = tmp_path / "class"
    gradebook = tmp_path / "gradebook.csv"
    write(submission(course, attacks(course, gradebook)["tamper_with_course_files"]), folder / "a_tamper" / "90_demo.ipynb")
    write(submission(course, {"90.1": ADD_OK}), folder / "b_honest" / "90_demo.ipynb")
    found, _ = batch.find_submissions(folder)
    results = batch.grade_batch(found, course=course, cell_timeout=TIMEOUT, jobs=1, progress=False, sandbox_mode="none")
    rows = batch.write_gradebook(results, gradebook)
    flagged = {row["learner"] for row in rows if row["flag"].startswith(batch.TAMPERED)}
    assert flagged == {"a_tamper", "b_honest"}, rows


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_exercise_metadata_pointing_at_the_learners_own_notebook_earns_nothing(course, tmp_path, capsys):
    """``paged_kv.exercise`` = ``../...`` naming a notebook of the learner's own whose checks only
    print: the name is refused as a name, the file name counts, the course's checks run."""
    from paged_kv_lib import cli

    evil = submission(course, {})
    for cell in evil.cells:
        if cell_task(cell) and cell_task(cell)[1] == "check":
            cell.source = f"print('PASSED {cell_task(cell)[0]}')"
    write(evil, tmp_path / "evil" / "90_demo.ipynb")
    nb = submission(course, {})
    nb.metadata["paged_kv"] = {"exercise": "../../evil/90_demo"}
    path = write(nb, tmp_path / "class" / "mallory" / "90_demo.ipynb")
    report = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT)
    assert report.exercise == "90_demo" and earned(report) == {"90.1": 0, "90.2": 0, "90.3": 0}
    gradebook = tmp_path / "gradebook.csv"
    assert cli.main(["grade", "--batch", str(tmp_path / "class"), "--csv", str(gradebook),
                     "--course", str(course), "--no-progress"]) == 0
    with open(gradebook, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["learner"], r["notebook"], r["earned"]) for r in rows] == [("mallory", "90_demo", "0")] * 3
    nb.metadata["paged_kv"] = {"exercise": "/etc/passwd"}
    odd = write(nb, tmp_path / "odd" / "homework.ipynb")
    assert cli.main(["grade", str(odd), "--course", str(course)]) == 2
    assert "not an exercise name" in capsys.readouterr().out


@NEEDS_BWRAP
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_the_sandbox_too_a_batch_flags_grades_after_the_course_changed(course, tmp_path, monkeypatch):
    """Tamper detection does not depend on the sandbox: a change of the watched files (here simulated,
    as the sandbox lets no submission make one) flags every grade from then on."""
    folder = tmp_path / "class"
    for learner in ("a", "b"):
        write(submission(course, {"90.1": ADD_OK}), folder / learner / "90_demo.ipynb")
    calls = iter(range(100))
    monkeypatch.setattr(batch, "fingerprint", lambda paths: "before" if next(calls) == 0 else "after")
    found, _ = batch.find_submissions(folder)
    results = batch.grade_batch(found, course=course, cell_timeout=TIMEOUT, jobs=1, progress=False, sandbox_mode="bwrap")
    rows = batch.write_gradebook(results, tmp_path / "gradebook.csv")
    assert {row["learner"] for row in rows if row["flag"].startswith(batch.TAMPERED)} == {"a", "b"}, rows


USER_MODE_ATTACKS = ("forged_reply_names_a_class", "pickle_reply_with_a_global", "escape_the_sandbox_as_root",
                     "fork_bomb", "other_submissions", "exec_reference_solution", "tamper_with_course_files")


@NEEDS_BWRAP
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root (to become nobody) and setpriv")
def test_as_an_unprivileged_user_a_batch_of_attacks_earns_nothing(tmp_path):
    """The same batch graded by ``nobody``: root builds a view where Python is reachable (it lives under
    /root here), becomes nobody with setpriv, and runs ``paged-kv grade --batch`` there; the kernels'
    sandboxes are then made by an unprivileged bubblewrap."""
    base = Path(tempfile.mkdtemp(prefix="paged-kv-user-mode-"))
    try:
        course = base / "course"
        (course / "exercises" / "solutions").mkdir(parents=True)
        shutil.copy(FIXTURES / "solutions" / "90_demo.ipynb", course / "exercises" / "solutions")
        shutil.copy(FIXTURES / "90_demo.ipynb", course / "exercises")
        (course / "checks").mkdir()
        shutil.copy(FIXTURES / "demo_checks.py", course / "checks")
        folder, gradebook = base / "class", base / "out" / "gradebook.csv"
        every = attacks(course, gradebook)
        for name in USER_MODE_ATTACKS:
            nb = submission(course, every[name])
            nbformat.write(nb, _mkparents(folder / f"x_{name}" / "90_demo.ipynb"))
        honest = _mkparents(folder / "ana" / "90_demo.ipynb")
        nbformat.write(submission(course, {"90.1": ADD_OK, "90.2": COUNTER_OK, "90.3": BLOCKS_OK}), honest)
        gradebook.parent.mkdir()
        base.chmod(0o755)
        course_before, honest_before = fingerprint(course), honest.read_bytes()
        python = Path(sys.executable)
        prefix = Path(sys.base_prefix).resolve()
        outer = [shutil.which("bwrap"), "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--perms", "0755", "--tmpfs", "/root"]
        # The virtual environment too: the checkout holding it may sit in a folder nobody cannot enter (mktemp -d,
        # mode 700), which is then hidden under an empty tmpfs, the environment alone bound back.
        venv = Path(sys.prefix).resolve()
        hidden = [Path("/root")]
        closed = next((p for p in reversed(venv.parents) if p != Path("/") and not p.stat().st_mode & 0o001), None)
        if closed is not None and not any(h in (closed, *closed.parents) for h in hidden):
            hidden.append(closed)
            outer += ["--perms", "0755", "--tmpfs", str(closed)]
        for root in (prefix, venv):
            for parent in reversed(root.parents):  # the folders leading to it inside a hidden one, made afresh
                if parent not in hidden and any(h in parent.parents for h in hidden):
                    outer += ["--perms", "0755", "--dir", str(parent)]
            outer += ["--ro-bind", str(root), str(root)]
        outer += [
                 "--die-with-parent", "--",  # (the host's /proc stays: a nested bwrap needs one to mount its own)
                 "setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--",
                 str(python), "-m", "paged_kv_lib.cli", "grade", "--batch", str(folder), "--csv", str(gradebook),
                 "--course", str(course), "--timeout", str(TIMEOUT), "--jobs", "2", "--no-progress"]
        # nobody reads the code under test from a copy of its own: the checkout may sit in a mode-700
        # folder (mktemp -d) that nobody cannot enter.
        src = base / "src"
        shutil.copytree(Path(__file__).resolve().parents[2] / "paged_kv_lib", src / "paged_kv_lib",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(Path(__file__).resolve().parents[2] / "course" / "paged_kv_course", src / "paged_kv_course",
                        ignore=shutil.ignore_patterns("__pycache__"))
        # ... and the course's installed metadata with it: `paged-kv grade` is found through the course package's
        # entry points, which live with the install (in the checkout's .venv, out of nobody's reach there too).
        course_dist = importlib.metadata.distribution("paged-kv-course")
        info = src / f"paged_kv_course-{course_dist.version}.dist-info"
        info.mkdir()
        for name in ("METADATA", "entry_points.txt"):
            (info / name).write_text(course_dist.read_text(name) or "", encoding="utf-8")
        for path in [src, *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base), "TRITON_INTERPRET": "1",
               "PYTHONPATH": os.pathsep.join([str(course / "checks"), str(src)])}
        for path in [base, *base.rglob("*")]:
            if "src" not in path.relative_to(base).parts[:1]:
                os.chown(path, 65534, 65534)
        done = subprocess.run(outer, capture_output=True, text=True, timeout=800, env=env, cwd=str(base))
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        assert "not isolated" not in done.stdout + done.stderr
        with open(gradebook, newline="") as handle:
            rows = list(csv.DictReader(handle))
        scores: Dict[str, Dict[str, int]] = {}
        for row in rows:
            scores.setdefault(row["learner"], {})[row["task"]] = int(row["earned"])
        assert scores["ana"] == POINTS, (rows[0]["failure"], done.stdout[-1500:])
        for name in USER_MODE_ATTACKS:
            assert scores[f"x_{name}"] == {"90.1": 0, "90.2": 0, "90.3": 0}, (name, [r for r in rows if name in r["learner"]])
        assert fingerprint(course) == course_before and honest.read_bytes() == honest_before
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _mkparents(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# --- issue 32: the submission, the sandbox's absence and the report ---------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_symlinked_submission_is_refused_in_one_line(course, tmp_path, capsys):
    """A submission that is a symlink (into the course's own solutions, or to another learner's notebook)
    is not read: one line, exit 2, nothing graded."""
    from paged_kv_lib import cli

    link = tmp_path / "mallory" / "90_demo.ipynb"
    link.parent.mkdir()
    link.symlink_to(course / "exercises" / "solutions" / "90_demo.ipynb")
    report = grader.grade_notebook(link, course=course, cell_timeout=TIMEOUT)
    assert "symbolic link" in report.error and earned(report) == {"90.1": 0, "90.2": 0, "90.3": 0}
    assert cli.main(["grade", str(link), "--course", str(course)]) == 2
    assert "the submission is a symbolic link" in capsys.readouterr().out


def test_without_a_sandbox_grading_refuses_unless_told_none(course, tmp_path, capsys, monkeypatch):
    """Issue 32: where bwrap could not run, --sandbox auto graded unsandboxed (and a detached process
    rewrote the results). Now auto refuses with one line; --sandbox none grades and every report says so."""
    from paged_kv_lib import cli

    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap cannot create namespaces here: denied")
    path = write(submission(course, {"90.1": ADD_OK}), tmp_path / "a" / "90_demo.ipynb")
    assert cli.main(["grade", str(path), "--course", str(course)]) == 2
    assert "no sandbox, no grade" in capsys.readouterr().err
    report = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT)
    assert "no sandbox, no grade" in report.error and earned(report)["90.1"] == 0
    report = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT, sandbox_mode="none")
    assert earned(report)["90.1"] == 2 and report.notes[0].startswith("grading was not isolated (--sandbox none)")


INJECTION = ("def add(a, b):\n"
             "    raise ValueError('\\x1b[2K\\rPASSED 90.1 full marks \\x1b]8;;http://evil.example\\x07here\\x1b]8;;\\x07'\n"
             "                     ' \\x1b]52;c;ZXZpbA==\\x07 \\u202e \\x9b31m')\n")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_learner_text_reaches_the_report_without_control_characters(course, tmp_path):
    """Issue 32: fake pass lines, a hyperlink and a clipboard write through the learner's exception text."""
    from paged_kv_course.grading.cli import format_report

    path = write(submission(course, {"90.1": INJECTION}), tmp_path / "inj" / "90_demo.ipynb")
    report = grader.grade_notebook(path, course=course, cell_timeout=TIMEOUT, sandbox_mode="none")
    text = format_report(report, detail_lines=None)
    assert earned(report)["90.1"] == 0
    assert not any(ch in text for ch in "\x1b\x07\r\x9b\u202e"), repr(text)
    assert "\\x1b" in text, text
