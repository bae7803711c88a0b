"""One command for a CUDA machine: attention tests, the kernel benchmark, the last lesson.

    python benchmarks/gpu_check.py          (or: make gpu-check)

Runs, each in a subprocess with its share of a seven-minute budget:

1. pytest on the attention tests (the CUDA-only ones included), on four pytest-xdist
   workers with each file kept on one worker, so kernel compiles overlap;
2. ``benchmarks/attention.py`` on large bf16 batches (block size 16, 1 GiB of K/V and
   more per call), every fused SDPA backend and the ragged alternatives, and a sweep of
   launch settings and split counts; it also records the figures in
   ``benchmarks/measured/attention_gpu.json`` (commit it: lesson 09 shows them on a CPU);
3. ``lessons/09_paged_attention.ipynb`` through nbclient, if the notebook exists.

Everything lands in ``$GPU_CHECK_OUT`` (default ``gpu-check-out/``): each step's output
as text, the benchmark as JSON, and ``summary.json`` / ``summary.txt`` judging the
figures against the targets (>= 60% of copy bandwidth on large work, 75% the goal;
>= 0.8x the fastest SDPA backend on equal lengths; faster than the best ragged
alternative: padded SDPA, a per-sequence SDPA loop or FlexAttention).

Exit status: 0 all passed; 1 a step failed; 2 no CUDA; 3 steps passed but a target missed.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 420  # the whole check, so `make gpu-check` stays under seven minutes
STEP_CAPS_S = {"tests": 170, "benchmark": 170, "notebook": 90}
TEST_WORKERS = 4
NOTEBOOK = ROOT / "lessons" / "09_paged_attention.ipynb"
TEST_FILES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "attention").glob("test_attention*.py"))

TARGETS = {
    "min_fraction_of_copy_bw": 0.60,
    "goal_fraction_of_copy_bw": 0.75,
    "min_speed_vs_sdpa_equal": 0.80,
    "min_speed_vs_sdpa_ragged": 1.00,
}


def fail(message: str, code: int) -> None:
    print(f"gpu-check: FAILED: {message}", file=sys.stderr)
    sys.exit(code)


def require_cuda() -> Dict[str, str]:
    """Stop with exit status 2 unless torch sees a CUDA GPU; return what it sees."""
    try:
        import torch
    except ImportError:
        fail("torch is not installed", 2)
    if not torch.cuda.is_available():
        fail(
            "no CUDA GPU is visible to torch "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
            "this check only makes sense on a GPU machine",
            2,
        )
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        fail("triton is not installed: pip install 'paged-kv[triton]'", 2)
    props = torch.cuda.get_device_properties(0)
    sys.path.insert(0, str(ROOT))  # the course's library, installed or not
    from paged_kv_lib.attention import MIN_TRITON_CAPABILITY

    if (props.major, props.minor) < MIN_TRITON_CAPABILITY:
        fail(f"{torch.cuda.get_device_name(0)} is sm_{props.major}{props.minor}; the Triton kernels this check "
             "measures need sm_{}{} or newer (below it the library runs attention on torch)".format(
                 *MIN_TRITON_CAPABILITY), 2)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": f"{props.total_memory / 2**30:.1f}",
        "sms": str(props.multi_processor_count),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "triton": triton_version,
        "python": platform.python_version(),
    }


class Budget:
    """Seconds left of the whole check; each step gets at most its cap."""

    def __init__(self, total: float) -> None:
        self.deadline = time.monotonic() + total

    def for_step(self, cap: float) -> float:
        return max(10.0, min(cap, self.deadline - time.monotonic()))


def run_step(name: str, cmd: List[str], out_dir: Path, timeout: float) -> dict:
    """Run one step, echoing its output and saving it to ``<name>.txt``; report status and time."""
    print(f"\n== {name}: {' '.join(cmd)} (up to {timeout:.0f} s)", flush=True)
    start = time.monotonic()
    log_path = out_dir / f"{name}.txt"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def pump() -> None:  # a thread, so a silent hang cannot block the timeout
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
            status = "passed" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            status = f"timed out after {timeout:.0f} s"
        reader.join(timeout=5)
        if status.startswith("timed out"):
            log.write(f"\n[gpu-check] {status}\n")
    seconds = time.monotonic() - start
    print(f"== {name}: {status} in {seconds:.0f} s", flush=True)
    return {"step": name, "status": status, "seconds": round(seconds, 1), "log": log_path.name}


def run_notebook(out_dir: Path, timeout: float) -> dict:
    if not NOTEBOOK.exists():
        note = f"skipped: {NOTEBOOK.relative_to(ROOT)} does not exist yet"
        print(f"\n== notebook: {note}")
        return {"step": "notebook", "status": note, "seconds": 0.0}
    executed = out_dir / "09_paged_attention.executed.ipynb"
    code = (
        "import sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        f"nb = nbformat.read({str(NOTEBOOK)!r}, as_version=4)\n"
        f"client = NotebookClient(nb, timeout={int(timeout)}, kernel_name='python3', "
        f"resources={{'metadata': {{'path': {str(NOTEBOOK.parent)!r}}}}})\n"
        "try:\n"
        "    client.execute()\n"
        "finally:\n"
        f"    nbformat.write(nb, {str(executed)!r})\n"
        "print('executed', len(nb.cells), 'cells')\n"
    )
    return run_step("notebook", [sys.executable, "-c", code], out_dir, timeout)


def judge(bench: dict) -> List[dict]:
    """Compare the benchmark's figures with the targets, one row per target."""
    by_case = {r["case"]: r for r in bench.get("results", [])}
    rows = []

    def add(target: str, case: str, key: str, minimum: float) -> None:
        value = by_case.get(case, {}).get(key)
        ok = value is not None and value >= minimum
        rows.append({"target": target, "case": case, "value": value, "minimum": minimum, "met": ok})

    equal, ragged = "equal 64x4096", "ragged 128 in [64,8192]"
    add("copy bandwidth fraction (equal, 1 GiB)", equal, "fraction_of_copy_bw", TARGETS["min_fraction_of_copy_bw"])
    add("copy bandwidth fraction (ragged, 1 GiB real)", ragged, "fraction_of_copy_bw", TARGETS["min_fraction_of_copy_bw"])
    add("speed vs the fastest SDPA backend, equal lengths", equal, "speed_vs_sdpa", TARGETS["min_speed_vs_sdpa_equal"])
    add("speed vs the best ragged alternative", ragged, "speed_vs_best_alternative", TARGETS["min_speed_vs_sdpa_ragged"])
    return rows


def _ms(value: object) -> str:
    return f"{value:.3f} ms" if isinstance(value, (int, float)) else "-"


def _ratio(value: object) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"


def write_summary(out_dir: Path, env: dict, steps: List[dict], targets: List[dict], bench: dict) -> str:
    lines = ["gpu-check summary", ""]
    lines += [f"{k}: {v}" for k, v in env.items()]
    lines.append("")
    for s in steps:
        lines.append(f"{s['step']:<10} {s['status']} ({s['seconds']} s)")
    if bench:
        lines += ["", f"copy bandwidth: {bench.get('copy_gbps') or 0:.0f} GB/s"]
        for r in bench.get("results", []):
            pct = r.get("fraction_of_copy_bw")
            lines.append(
                f"{r['case']:<26} paged {_ms(r['paged_ms'])}  fastest SDPA ({r.get('sdpa_backend') or 'none'}) "
                f"{_ms(r.get('sdpa_ms'))}  SDPA/paged {_ratio(r.get('speed_vs_sdpa'))}  "
                f"best alternative ({r.get('best_alternative') or 'none'}) {_ms(r.get('best_alternative_ms'))}  "
                f"alt/paged {_ratio(r.get('speed_vs_best_alternative'))}  {r.get('paged_gbps') or 0:.0f} GB/s"
                + (f"  {100 * pct:.1f}% of copy" if pct else "")
            )
            if r.get("sdpa_backends"):
                lines.append("    SDPA backends: " + ", ".join(f"{k} {_ms(v)}" for k, v in r["sdpa_backends"].items()))
            memory = r.get("memory") or {}
            if memory:
                lines.append("    memory: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in memory.items()))
        for label, part in (bench.get("tuning") or {}).items():
            best = next((row for row in part.get("rows", []) if "ms" in row), None)
            lines.append(f"tuning {label} on {part.get('case')}: fastest {best}; default {part.get('default')} "
                         f"at {_ms(part.get('default_ms'))}")
    lines.append("")
    for t in targets:
        value = "missing" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"[{'met' if t['met'] else 'MISSED'}] {t['target']}: {value} (need >= {t['minimum']})")
    goal = next((t for t in targets if t["case"] == "equal 64x4096" and "bandwidth" in t["target"]), None)
    if goal and goal["value"] is not None:
        lines.append(f"goal of {TARGETS['goal_fraction_of_copy_bw']:.0%} of copy bandwidth: "
                     f"{'reached' if goal['value'] >= TARGETS['goal_fraction_of_copy_bw'] else 'not reached'}")
    text = "\n".join(lines) + "\n"
    (out_dir / "summary.txt").write_text(text)
    (out_dir / "summary.json").write_text(
        json.dumps({"environment": env, "steps": steps, "targets": targets, "benchmark": bench}, indent=2)
    )
    return text


def main() -> int:
    env = require_cuda()
    out_dir = Path(os.environ.get("GPU_CHECK_OUT", "gpu-check-out"))
    if not out_dir.is_absolute():
        out_dir = ROOT / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(BUDGET_S)
    print(f"gpu-check on {env['gpu']} (sm {env['capability']}), results in {out_dir}")

    steps = [
        run_step(
            "tests",
            [sys.executable, "-m", "pytest", *TEST_FILES, "-q", "-rs", "-p", "no:randomly",
             "-n", str(TEST_WORKERS), "--dist", "loadfile",
             "--timeout", "150", f"--junitxml={out_dir / 'tests.xml'}"],
            out_dir, budget.for_step(STEP_CAPS_S["tests"]),
        )
    ]
    bench_json = out_dir / "benchmark.json"
    steps.append(
        run_step(
            "benchmark",
            [sys.executable, "benchmarks/attention.py", "--device", "cuda", "--sizes", "large",
             "--tune", "--record", "--json", str(bench_json)],
            out_dir, budget.for_step(STEP_CAPS_S["benchmark"]),
        )
    )
    steps.append(run_notebook(out_dir, budget.for_step(STEP_CAPS_S["notebook"])))

    bench = json.loads(bench_json.read_text()) if bench_json.exists() else {}
    targets = judge(bench)
    print("\n" + write_summary(out_dir, env, steps, targets, bench))

    failed = [s["step"] for s in steps if not (s["status"] == "passed" or s["status"].startswith("skipped"))]
    if failed:
        fail(f"step(s) {', '.join(failed)} did not pass; see {out_dir}", 1)
    missed = [t["target"] for t in targets if not t["met"]]
    if missed:
        fail(f"target(s) missed: {'; '.join(missed)}; see {out_dir / 'summary.txt'}", 3)
    print("gpu-check: all steps passed and all targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
