"""``benchmarks/attention.py --smoke``: tiny cases through the Triton interpreter, GPU-run JSON schema."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "attention.py"

pytest.importorskip("triton")


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("attention_benchmark_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_run_writes_the_gpu_schema(tmp_path):
    out = tmp_path / "smoke.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=580,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())

    # The top level and each result carry exactly the keys a GPU run writes.
    assert set(data) == {"device", "torch", "cuda", "triton", "backend", "sizes", "copy_gbps", "results", "tuning", "cases"}
    assert data["sizes"] == "smoke" and data["backend"] == "triton" and data["copy_gbps"] > 0
    bench = _benchmark_module()
    fields = {f.name for f in dataclasses.fields(bench.Result)}
    assert len(data["results"]) == len(bench.smoke_cases()) == 2
    for row in data["results"]:
        assert set(row) == fields
        assert isinstance(row["sdpa_backends"], dict)
        for name, ms in row["sdpa_backends"].items():
            assert name.split("+")[0] in bench.FUSED_SDPA_BACKENDS and ms > 0
        if row["sdpa_backends"]:
            assert row["sdpa_backend"] == min(row["sdpa_backends"], key=row["sdpa_backends"].get)
            assert row["speed_vs_sdpa"] == pytest.approx(row["sdpa_ms"] / row["paged_ms"])
        else:
            assert row["sdpa_ms"] is None and row["speed_vs_sdpa"] is None
        assert row["paged_gbps"] == pytest.approx(row["kv_bytes"] / (row["paged_ms"] * 1e-3) / 1e9)
        assert row["fraction_of_copy_bw"] == pytest.approx(row["paged_gbps"] / data["copy_gbps"])
        assert row["memory"]["per_sequence_kv_bytes"] == row["kv_bytes"]
        assert row["memory"]["padded_kv_bytes"] >= row["kv_bytes"]

    equal, ragged = data["results"]
    assert equal["memory"]["padded_kv_bytes"] == equal["kv_bytes"]
    # Ragged: padded backends, the per-sequence loop and (where torch has it) FlexAttention.
    assert bench.PER_SEQUENCE_LOOP in ragged["alternatives"]
    assert bench.FLEX in ragged["alternatives"] or bench.FLEX in ragged["skipped"]
    assert all(f"padded {name}" in ragged["alternatives"] for name in ragged["sdpa_backends"])
    assert ragged["best_alternative"] == min(ragged["alternatives"], key=ragged["alternatives"].get)
    assert ragged["memory"]["padded_kv_bytes"] > ragged["kv_bytes"]
    assert "SDPA backends:" in result.stdout


def test_smoke_refuses_a_gpu_device():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--device", "cuda"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "--smoke runs on the CPU" in result.stderr
