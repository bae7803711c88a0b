"""``benchmarks/gpu_check.py`` and ``make gpu-check``: a clear refusal without CUDA, and the judging."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
no_cuda_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@no_cuda_only
def test_without_cuda_exits_2_with_one_clear_line():
    result = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: FAILED: no CUDA GPU is visible to torch")


@no_cuda_only
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_fails_with_the_scripts_status_and_a_clear_line():
    # -o install: do not (re)install anything; the venv running this test is the one make uses.
    env = dict(os.environ, PY=sys.executable)
    result = subprocess.run(
        ["make", "-s", "-o", "install", "gpu-check", f"PY={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode != 0
    assert "gpu-check: FAILED: no CUDA GPU" in result.stderr
    assert "make gpu-check: exit 2: no CUDA GPU or Triton here" in result.stderr
    assert "Error 2" in result.stderr  # make's own line carries the script's status


def _row(case, **values):
    row = dict(case=case, paged_ms=1.0, sdpa_ms=None, speed_vs_sdpa=None, sdpa_backend=None, sdpa_backends={},
               best_alternative=None, best_alternative_ms=None, speed_vs_best_alternative=None,
               paged_gbps=100.0, fraction_of_copy_bw=None, memory={})
    row.update(values)
    return row


def test_judge_uses_the_fastest_backend_and_the_best_ragged_alternative(tmp_path):
    gpu_check = _gpu_check()
    bench = {
        "copy_gbps": 8000.0,
        "results": [
            _row("equal 64x4096", **{"fraction_of_copy_bw": 0.7, "speed_vs_sdpa": 0.85, "sdpa_ms": 0.85,
                                     "sdpa_backend": "FLASH_ATTENTION", "sdpa_backends": {"FLASH_ATTENTION": 0.85}}),
            _row("ragged 128 in [64,8192]", **{"fraction_of_copy_bw": 0.5, "speed_vs_sdpa": 3.0,
                                               "speed_vs_best_alternative": 0.9,
                                               "best_alternative": "per-sequence SDPA loop"}),
        ],
        "tuning": {"launch": {"case": "equal 64x4096", "rows": [{"block_n": 64, "ms": 1.0}],
                              "default_ms": 1.1, "default": {"block_n": 64}}},
    }
    targets = {t["target"]: t for t in gpu_check.judge(bench)}
    assert targets["copy bandwidth fraction (equal, 1 GiB)"]["met"]
    assert not targets["copy bandwidth fraction (ragged, 1 GiB real)"]["met"]
    assert targets["speed vs the fastest SDPA backend, equal lengths"]["met"]
    # 3x faster than padded SDPA, but slower than the per-sequence loop: the target is missed.
    assert not targets["speed vs the best ragged alternative"]["met"]
    assert targets["speed vs the best ragged alternative"]["value"] == 0.9

    text = gpu_check.write_summary(tmp_path, {"gpu": "test"}, [], list(targets.values()), bench)
    assert "fastest SDPA (FLASH_ATTENTION)" in text and "best alternative (per-sequence SDPA loop)" in text
    assert "[MISSED] speed vs the best ragged alternative: 0.900" in text
    assert (tmp_path / "summary.json").exists()


def test_judge_reports_a_missing_figure_as_missed():
    gpu_check = _gpu_check()
    targets = gpu_check.judge({"results": [_row("equal 64x4096")]})
    assert targets and all(not t["met"] for t in targets)
    assert all(t["value"] is None for t in targets)
