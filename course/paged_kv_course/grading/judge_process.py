"""Running the judge (:mod:`.judge`) as a bounded process of its own, and reading its events.

The whole submission has one time limit. The judge stops itself at it; should it not (a check
stuck in a C call), this process kills it a little later: the cell it was running fails with
one line, the later ones are not run. A judge that crashes or is killed is one line too.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import sandbox
DEFAULT_TIMEOUT_S = 300.0
# Past the submission's limit: the judge's time to stop the kernel and report before this process kills it.
JUDGE_GRACE_S = 30.0


def kernel_cpu_seconds(timeout: float, grace: float = JUDGE_GRACE_S) -> int:
    """The learner's kernel's CPU-time allowance: the limit plus two thirds of the grace, so it stays under the
    judge's own (the limit plus all of it), which a kernel the judge starts cannot raise its limit past."""
    return int(timeout + grace * 2 / 3)


class GradingError(RuntimeError):
    """The grader itself could not run a notebook (not the learner's failure)."""



def run_judge(
    cells: List[dict],
    workdir: Path,
    timeout: float = DEFAULT_TIMEOUT_S,
    sandbox_mode: str = "auto",
    hidden: Sequence[Path] = (),
    grace: float = JUDGE_GRACE_S,
) -> Tuple[Dict[int, dict], str]:
    """Run the judge in its own bounded process, ``timeout`` seconds for the whole submission; per-cell
    results by code-cell number, and the note on isolation and limits. Raises
    :class:`.sandbox.SandboxUnavailableError` where there is no sandbox and none was not asked for."""
    resolved = sandbox.resolve_mode(sandbox_mode)
    note = "" if resolved == "bwrap" else sandbox.NOT_ISOLATED
    workdir.mkdir(parents=True, exist_ok=True)
    job = {"cells": cells, "timeout": timeout, "workdir": str(workdir), "mode": resolved,
           "hidden": [str(h) for h in hidden], "grace": grace}
    budget = timeout + grace
    # The checks run tiny tensors: one torch thread (threads that spin on a busy machine made exercise 06's
    # checks 3x slower, docs/benchmarks.md).
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    if env.get("PYTHONPATH"):  # the kernel runs in workdir: relative entries would point elsewhere
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(entry).resolve()) for entry in env["PYTHONPATH"].split(os.pathsep) if entry
        )
    with tempfile.TemporaryFile() as job_file:
        job_file.write(json.dumps(job).encode())
        job_file.seek(0)
        process = subprocess.Popen(
            [sys.executable, "-m", "paged_kv_course.grading.judge"], stdin=job_file, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, env=env, cwd=str(workdir.parent),
            preexec_fn=_judge_limits(int(budget)),
        )
    try:
        events = _watch(process, time.monotonic() + budget, timeout)
    finally:
        _kill_group(process)
        process.wait()
    results: Dict[int, dict] = {}
    done: Optional[dict] = None
    stopped = ""
    for event in events:
        if "result" in event:
            results[int(event["result"]["index"])] = event["result"]
        elif "done" in event:
            done = event["done"]
        elif "stopped" in event:
            stopped = str(event["stopped"])
    if done is None:
        why = stopped or _exit_reason(process.returncode)
        if not results and not any(e.get("cell", -1) >= 0 for e in events if "cell" in e):
            raise GradingError(f"the judge stopped before the first cell: {why}")
        started = [int(e["cell"]) for e in events if "cell" in e]
        current = started[-1] if started else -1
        for index in range(len(cells)):
            if index not in results:
                line = why if index == current else f"not run: the judge was stopped at an earlier cell ({why})"
                results[index] = {"index": index, "outcome": "failed", "line": line, "detail": ""}
        return results, note
    if done.get("error"):
        raise GradingError(str(done["error"]).strip().splitlines()[0])
    applied = str(done.get("limits", ""))
    if applied:
        note = f"{note}; {applied}" if note else f"the learner's kernel: {applied}"
    return {int(entry["index"]): entry for entry in done.get("results", [])}, note


JUDGE_MEMORY_BYTES = 6 * 1024 ** 3


def _judge_limits(cpu_seconds: int) -> Callable[[], None]:
    """The judge's own bounds: address space and CPU time (its replies are bounded before decoding)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (JUDGE_MEMORY_BYTES, JUDGE_MEMORY_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _watch(process: "subprocess.Popen[bytes]", overall: float, timeout: float) -> List[dict]:
    """The judge's events, read as they come; kills it when the whole submission is late."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    events: List[dict] = []
    buffer = b""
    while True:
        remaining = overall - time.monotonic()
        if remaining <= 0:
            events.append({"stopped": f"timed out: the submission ran past its limit of {timeout:g} s "
                                      "(the grader stopped the judge)"})
            return events
        if not select.select([fd], [], [], remaining)[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:  # a judge that crashed is let exit: its status is the report, not the kill that follows
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            return events
        buffer += chunk
        if len(buffer) > 64 * 1024 * 1024:
            events.append({"stopped": "the judge wrote more than the grader reads"})
            return events
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if type(event) is dict:
                events.append(event)
                if "done" in event:
                    return events


def _exit_reason(code: Optional[int]) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        hint = " (out of memory or CPU time?)" if -code in (signal.SIGKILL, signal.SIGXCPU, signal.SIGSEGV) else ""
        return f"the judge was killed by {name}{hint}"
    return f"the judge stopped with exit status {code} before it finished"


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the judge and whatever it started in its session (the sandbox dies with it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
