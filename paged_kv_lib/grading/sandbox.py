"""Where the learner's code runs while it is graded: a bubblewrap sandbox, or a plain process.

With bubblewrap (``bwrap``) the learner's kernel sees the file system read-only (so the
library and the checks cannot be changed), a private ``/tmp``, its own working folder as
the only writable place, nothing of the folders the grader names as hidden (the course's
``exercises/`` with the solutions, the class's submissions, the grader's output), no
network, and its own process and IPC namespaces: when it ends, every process it started
ends too. CPU time and address space are limited with ``setrlimit`` in both modes.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

SANDBOX_MODES = ("auto", "bwrap", "none")
DEFAULT_MEMORY_BYTES = 4 * 1024 ** 3
NOT_ISOLATED = "grading was not isolated: no bubblewrap sandbox ({reason}); the learner's code ran with your permissions"


class SandboxUnavailableError(RuntimeError):
    """``--sandbox bwrap`` was asked for and bubblewrap cannot run here."""


@dataclass
class SandboxSpec:
    """What the learner's process may see and use."""

    mode: str = "auto"
    workdir: Path = Path(".")
    hidden: List[Path] = field(default_factory=list)
    cpu_seconds: int = 600
    memory_bytes: int = DEFAULT_MEMORY_BYTES


_PROBE: Dict[str, str] = {}


def bwrap_problem() -> str:
    """Why bubblewrap cannot be used here ('' when it can); probed once per process."""
    if "result" in _PROBE:
        return _PROBE["result"]
    path = shutil.which("bwrap")
    if path is None:
        problem = "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    else:
        try:
            done = subprocess.run(
                [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--proc", "/proc",
                 "--dev", "/dev", "true"],
                capture_output=True, text=True, timeout=30,
            )
            problem = "" if done.returncode == 0 else f"bwrap cannot create namespaces here: {done.stderr.strip()[:200]}"
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"bwrap failed to start: {exc}"
    _PROBE["result"] = problem
    return problem


def resolve_mode(mode: str) -> str:
    """``bwrap`` or ``none`` for a requested mode; ``bwrap`` that cannot run raises."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode {mode!r} is not one of {', '.join(SANDBOX_MODES)}")
    if mode == "none":
        return "none"
    problem = bwrap_problem()
    if not problem:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxUnavailableError(f"--sandbox bwrap: {problem}")
    return "none"


def _covers(folder: Path, path: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def command(spec: SandboxSpec, argv: Sequence[str], resolved_mode: str) -> List[str]:
    """The command line that runs ``argv`` under ``spec`` (``argv`` itself when not sandboxed)."""
    if resolved_mode != "bwrap":
        return list(argv)
    workdir = spec.workdir.resolve()
    needed = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(__file__).resolve().parents[2]]
    needed += [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Folders a .pth file put on the path (another environment's site-packages, say) are needed too.
    needed += [Path(p).resolve() for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != Path.cwd().resolve()]
    cmd = [
        shutil.which("bwrap") or "bwrap",
        "--ro-bind", "/", "/",
        "--dev", "/dev", "--proc", "/proc",
        "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--tmpfs", "/run",
        "--unshare-all", "--die-with-parent", "--new-session",
    ]
    tmp = Path("/tmp").resolve()
    for path in sorted(set(needed)):  # what the kernel needs from /tmp (a virtual environment there) comes back read-only
        if path != tmp and _covers(tmp, path) and path.exists():
            cmd += ["--ro-bind", str(path), str(path)]
    for folder in spec.hidden:
        folder = folder.resolve()
        if not folder.is_dir() or any(_covers(folder, n) for n in needed):
            continue  # (a folder above the working folder may go: the working folder is bound after it)
        cmd += ["--tmpfs", str(folder)]
    home = Path.home()
    if home.is_dir() and not any(_covers(home, n) for n in needed) and not _covers(home, workdir):
        cmd += ["--tmpfs", str(home)]
    cmd += ["--bind", str(workdir), str(workdir), "--chdir", str(workdir), "--"]
    return cmd + list(argv)


def limits(spec: SandboxSpec) -> Callable[[], None]:
    """A ``preexec_fn`` that sets the CPU-time and address-space limits of the learner's process."""
    cpu, memory = spec.cpu_seconds, spec.memory_bytes

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def environment(spec: SandboxSpec) -> Dict[str, str]:
    """A small, explicit environment for the learner's process (no grader secrets pass through)."""
    keep = ("PATH", "LANG", "LC_ALL", "TRITON_INTERPRET", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(p).resolve()) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p
        )
    workdir = str(spec.workdir.resolve())
    env.update(HOME=workdir, TMPDIR=workdir if spec.mode == "none" else "/tmp", MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONHASHSEED="0", JUPYTER_PLATFORM_DIRS="1")
    return env


def start(spec: SandboxSpec, argv: Sequence[str], resolved_mode: str) -> "subprocess.Popen[bytes]":
    """Start ``argv`` in the sandbox with pipes on stdin and stdout, in a new process group."""
    spec.workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        command(spec, argv, resolved_mode), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, cwd=spec.workdir, env=environment(spec), start_new_session=True,
        preexec_fn=limits(spec), close_fds=True,
    )


def stop(process: "Optional[subprocess.Popen[bytes]]") -> None:
    """Kill the learner's process and its whole process group; wait for it."""
    if process is None:
        return
    try:
        os.killpg(process.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.kill()
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
