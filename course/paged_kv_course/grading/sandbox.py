"""Where the learner's code runs while it is graded: a bubblewrap sandbox, and only by request a plain process.

With bubblewrap (``bwrap``) the learner's kernel starts on an empty root and sees only what
it needs, read-only: the system's programs and libraries (``/usr``, ``/etc``...), Python and
its packages, and the library and course packages (bound under ``/opt/paged-kv/lib``); no
checkout (``.git/``, ``tests/``, ``exercises/``, solutions, hidden cases), no class folder, no
home. It writes only to a sized tmpfs home (``/home/learner``), ``/tmp`` and ``/dev/shm``,
whose sizes count against its memory; it has no network, its own process and IPC namespaces
(when it ends, every process it started ends too), no capabilities and a user namespace. Run
by root, the kernel first becomes an unprivileged uid of its own (``KERNEL_UID_BASE`` + a
slot). Where bubblewrap cannot run, grading refuses unless the instructor asks for
``--sandbox none`` (and then the report says so).

Memory: a cgroup caps the kernel's whole process tree where the system lets the grader
make one; else each process gets ``RLIMIT_AS`` and the tree ``RLIMIT_NPROC`` processes.
:attr:`SandboxSpec.applied` says which applied. CPU time is limited with ``RLIMIT_CPU``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

SANDBOX_MODES = ("auto", "bwrap", "none")
TMPFS_BYTES = {"/home/learner": 256 * 1024 ** 2, "/tmp": 256 * 1024 ** 2, "/dev/shm": 64 * 1024 ** 2}
DEFAULT_MEMORY_BYTES = 4 * 1024 ** 3
KERNEL_PROCESSES = 64
KERNEL_UID_BASE = 60000
KERNEL_UID_SLOTS = 4000
INSIDE = "/opt/paged-kv"
INSIDE_HOME = "/home/learner"
RUNNER = Path(__file__).with_name("runner.py")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
NOT_ISOLATED = "grading was not isolated (--sandbox none): the learner's code ran with your permissions"
REFUSED = ("no sandbox, no grade: {problem}. Install bubblewrap where user namespaces work, or grade inside a "
           "throwaway container with --sandbox none")
_PR_SET_PDEATHSIG = 1


class SandboxUnavailableError(RuntimeError):
    """Bubblewrap cannot run here and ``--sandbox none`` was not given: grading refuses."""


@dataclass
class SandboxSpec:
    """What the learner's process may see and use; ``applied`` is filled in when it starts."""

    mode: str = "auto"
    workdir: Path = Path(".")
    hidden: List[Path] = field(default_factory=list)
    cpu_seconds: int = 600
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    applied: str = ""
    cgroup: Optional[Path] = None


_PROBE: Dict[str, str] = {}


def bwrap_problem() -> str:
    """Why bubblewrap cannot be used here ('' when it can); probed once per process, the way the
    kernel is started (as root: as an unprivileged uid, with a user namespace)."""
    if "result" in _PROBE:
        return _PROBE["result"]
    path = shutil.which("bwrap")
    if path is None:
        problem = "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    else:
        try:
            uid = _kernel_uid() if os.geteuid() == 0 else None
            done = subprocess.run(
                [path, "--ro-bind", "/", "/", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
                 "--cap-drop", "ALL", "--die-with-parent", "--proc", "/proc", "--dev", "/dev", "true"],
                capture_output=True, text=True, timeout=30, preexec_fn=_become(uid) if uid is not None else None,
            )
            problem = "" if done.returncode == 0 else f"bwrap cannot create namespaces here: {done.stderr.strip()[:200]}"
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"bwrap failed to start: {exc}"
    _PROBE["result"] = problem
    return problem


def resolve_mode(mode: str) -> str:
    """``bwrap`` or ``none`` for a requested mode: ``none`` only when asked for by name; ``auto`` or
    ``bwrap`` where bubblewrap cannot run raise :class:`SandboxUnavailableError` (no silent fallback)."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode {mode!r} is not one of {', '.join(SANDBOX_MODES)}")
    if mode == "none":
        return "none"
    problem = bwrap_problem()
    if problem:
        raise SandboxUnavailableError(REFUSED.format(problem=problem))
    return "bwrap"


def _covers(folder: Path, path: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def _kernel_uid() -> int:
    """The unprivileged uid a root grader runs this kernel as (one per judge process)."""
    return KERNEL_UID_BASE + os.getpid() % KERNEL_UID_SLOTS


def checkout_root() -> Path:
    """The folder that holds the library package (a checkout, or site-packages)."""
    import paged_kv_lib

    return Path(paged_kv_lib.__file__).resolve().parents[1]


def package_folders() -> List[Path]:
    """The library's package folder and the course package's: what a kernel imports, staged for it."""
    import paged_kv_lib

    return [Path(paged_kv_lib.__file__).resolve().parent, Path(__file__).resolve().parents[1]]


def python_paths() -> List[Path]:
    """Folders the kernel's Python needs: its prefixes and the folders on its path, never the checkout
    (a virtual environment inside the checkout is bound alone, so the checkout's other files stay out)."""
    checkout = checkout_root()
    prefixes = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    found = list(prefixes)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [p for p in sys.path if p]
    for entry in extra:
        path = Path(entry).resolve()
        if not path.is_dir() or path == checkout or _covers(path, checkout) or path == Path.cwd().resolve():
            continue
        if _covers(checkout, path) and not any(_covers(p, path) for p in prefixes):
            continue  # the checkout's own folders (tests/, exercises/...) stay out
        if any((path / name).exists() for name in (".git", "paged_kv_lib", "paged_kv_course")):
            continue  # another copy of the course (an editable install's .pth names its root): staged apart
        if any(_covers(path, p) and path != p for p in prefixes):
            continue  # a folder holding the environment (a checkout with its .venv): the environment goes alone
        found.append(path)
    out: List[Path] = []
    for path in sorted(set(found), key=lambda p: len(p.parts)):
        if not any(_covers(o, path) for o in out):
            out.append(path)
    return out


def command(spec: SandboxSpec, resolved_mode: str, uid: Optional[int] = None) -> List[str]:
    """The command line that starts the kernel under ``spec``. With ``uid`` (a root grader) bubblewrap runs
    as root to build the view and keeps only the capabilities to change uid: the kernel itself then becomes
    ``uid`` and enters a user namespace of its own before it runs anything (see :mod:`.runner`)."""
    python = [sys.executable, "-s"]
    if resolved_mode != "bwrap":
        return python + [str(RUNNER)]
    hidden = [h.resolve() for h in spec.hidden]
    cmd = [shutil.which("bwrap") or "bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session",
           "--hostname", "kernel", "--cap-drop", "ALL"]
    if uid is None:
        cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    else:
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    binds = [p for p in python_paths()  # Python and its packages are bound even inside a hidden folder (a venv
             # in /tmp, or site-packages a .pth file put on the path)
             if (p in prefixes or p.name in ("site-packages", "dist-packages")
                 or not any(_covers(h, p) for h in hidden))
             and not any(_covers(Path(s), p) for s in SYSTEM_DIRS)]
    # A private, sized /tmp first: a folder bound below it afterwards (a venv in /tmp) stays visible on top.
    cmd += ["--perms", "1777", "--size", str(TMPFS_BYTES["/tmp"]), "--tmpfs", "/tmp"]
    parents = {a for p in [*binds, Path(INSIDE), Path(INSIDE_HOME)] for a in p.parents if a != Path("/")}
    for parent in sorted(parents, key=lambda a: len(a.parts)):  # made by bwrap, open to the kernel's uid
        cmd += ["--perms", "0755", "--dir", str(parent)]
    for folder in SYSTEM_DIRS:
        path = Path(folder)
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), folder]
        elif path.is_dir():
            cmd += ["--ro-bind", folder, folder]
    for path in binds:
        cmd += ["--ro-bind", str(path), str(path)]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMPFS_BYTES["/dev/shm"]),
            "--tmpfs", "/dev/shm", "--perms", "1777", "--size", str(TMPFS_BYTES[INSIDE_HOME]), "--tmpfs", INSIDE_HOME]
    cmd += ["--perms", "0755", "--dir", INSIDE, "--perms", "0755", "--dir", f"{INSIDE}/lib"]
    for package in package_folders():
        cmd += ["--ro-bind", str(package), f"{INSIDE}/lib/{package.name}"]
    return cmd + ["--chdir", INSIDE_HOME, "--"] + python + [f"{INSIDE}/lib/paged_kv_course/grading/runner.py"]


def _become(uid: Optional[int]) -> Callable[[], None]:
    def apply() -> None:
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _die_with_parent()

    return apply


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _processes_of(uid: int) -> int:
    """How many processes and threads ``uid`` runs now (what ``RLIMIT_NPROC`` counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                count += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
    return count


def _cgroup(spec: SandboxSpec) -> Optional[Path]:
    """A cgroup (v2) capping memory and processes of the kernel's tree, where the grader may make one."""
    try:
        line = next(li for li in Path("/proc/self/cgroup").read_text().splitlines() if li.startswith("0::"))
        parent = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
        if not (parent / "cgroup.controllers").is_file():
            return None  # not a cgroup v2 hierarchy (a v1 one, or none)
        group = parent / f"paged-kv-kernel-{os.getpid()}"
        group.mkdir()
        try:
            for name, value in (("memory.max", spec.memory_bytes), ("memory.swap.max", 0), ("pids.max", KERNEL_PROCESSES)):
                if not (group / name).is_file():  # the kernel makes these files in a real cgroup
                    raise OSError(f"no {name}")
                (group / name).write_text(str(value))
        except OSError:
            shutil.rmtree(group, ignore_errors=True)
            return None
        spec.cgroup = group
        return group
    except (OSError, StopIteration):
        return None


def limits(spec: SandboxSpec, group: Optional[Path] = None, nproc: Optional[int] = None) -> Callable[[], None]:
    """A ``preexec_fn``: join ``group``, die with the judge, set the CPU-time, address-space and (without a
    cgroup) process-count limits (a root grader's kernel is held by them once it has become its own uid)."""
    cpu, memory = spec.cpu_seconds, spec.memory_bytes

    def apply() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        _die_with_parent()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def environment(spec: SandboxSpec, resolved_mode: str = "none") -> Dict[str, str]:
    """A small, explicit environment for the learner's process (no grader secrets pass through)."""
    keep = ("PATH", "LANG", "LC_ALL", "TRITON_INTERPRET", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if resolved_mode == "bwrap":
        env.update(PYTHONPATH=os.pathsep.join([f"{INSIDE}/lib", *paths]), HOME=INSIDE_HOME, TMPDIR="/tmp")
    else:
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        workdir = str(spec.workdir.resolve())
        env.update(HOME=workdir, TMPDIR=workdir)
    env.update(MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONHASHSEED="0", JUPYTER_PLATFORM_DIRS="1", PYTHONNOUSERSITE="1")
    return env


def start_kernel(spec: SandboxSpec) -> "subprocess.Popen[bytes]":
    """Start the learner's kernel (:mod:`.runner`) under ``spec`` with pipes on stdin and stdout."""
    spec.workdir.mkdir(parents=True, exist_ok=True)
    resolved_mode = spec.mode
    uid: Optional[int] = None
    gib = spec.memory_bytes / 1024 ** 3
    if resolved_mode == "bwrap" and os.geteuid() == 0:
        uid = _kernel_uid()
    argv = command(spec, resolved_mode, uid)
    env = environment(spec, resolved_mode)
    if uid is not None:
        env["PAGED_KV_KERNEL_UID"] = str(uid)
    group = _cgroup(spec)
    nproc: Optional[int] = None
    if group is not None:
        spec.applied = f"memory: {gib:g} GiB for the kernel's whole process tree (a cgroup)"
    else:
        nproc = KERNEL_PROCESSES if uid is not None else _processes_of(os.getuid()) + KERNEL_PROCESSES
        spec.applied = (f"memory: {gib:g} GiB of address space per process, at most {KERNEL_PROCESSES} more processes "
                        "(RLIMIT_AS and RLIMIT_NPROC; no cgroup here)")
        if uid is None and os.geteuid() == 0:
            nproc = None  # root ignores RLIMIT_NPROC: only the sandbox's own uid makes it hold
            spec.applied = f"memory: {gib:g} GiB of address space per process (RLIMIT_AS; no cgroup, no process limit)"
    if resolved_mode == "bwrap":
        spec.applied += "; writable space: tmpfs of " + ", ".join(
            f"{n} {b // 1024 ** 2} MiB" for n, b in TMPFS_BYTES.items()) + " (counted apart from the memory limit)"
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        cwd=spec.workdir, env=env, start_new_session=True, preexec_fn=limits(spec, group, nproc), close_fds=True,
    )


def stop(process: "Optional[subprocess.Popen[bytes]]", spec: Optional[SandboxSpec] = None) -> None:
    """Kill the learner's process and its whole process group; wait for it; remove its cgroup."""
    if process is not None:
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
    if spec is not None and spec.cgroup is not None:
        try:
            spec.cgroup.rmdir()
        except OSError:
            pass
        spec.cgroup = None
