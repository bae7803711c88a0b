"""Compile the attention kernels for sm_90 (H100/H200) on a machine with no GPU.

Runs ``benchmarks/kernel_resources.py --quick`` in a subprocess (it needs Triton's real
compiler, not the interpreter this test session uses): every default launch of the
decode, merge and extend kernels must compile without a Triton warning and without
spilling registers, and a setting known to spill must be seen to spill. Skips where
Triton's NVIDIA toolchain (ptxas, cuobjdump) cannot run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = 77

pytest.importorskip("triton")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_default_kernels_compile_for_sm90_without_spills(tmp_path):
    rows_path = tmp_path / "rows.json"
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run(
        [sys.executable, "benchmarks/kernel_resources.py", "--quick", "--json", str(rows_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=880,
    )
    if result.returncode == SKIP:
        pytest.skip(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    rows = json.loads(rows_path.read_text())
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"_paged_decode_kernel", "_merge_splits_kernel", "_paged_extend_kernel"}
    assert all(r["reg"] > 0 and r["stack"] == 0 for r in rows)
    # 256 requested splits are cut so the merge tile fits: at most 16,384 fp32 elements.
    merges = [r["settings"] for r in rows if r["kernel"] == "_merge_splits_kernel"]
    assert merges and all(m["NUM_SPLITS"] * m["BLOCK_D"] <= 16384 for m in merges)
