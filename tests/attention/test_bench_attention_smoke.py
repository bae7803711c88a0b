"""``benchmarks/attention.py --smoke``: tiny cases through the Triton interpreter, GPU-run JSON schema."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
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


# ------------------------------------------------------------------ sizing to the GPU (issue 27)
def test_the_large_cases_notes_count_k_and_v():
    bench = _benchmark_module()
    for case in bench.large_cases():
        elem = 2  # bf16
        kv = 2 * sum(case.seq_lens) * case.num_kv_heads * case.head_dim * elem
        found = re.search(r"(about )?(\d+) GiB of K/V", case.note)
        if found:
            assert round(kv / 2**30) == int(found.group(2)), (case.name, kv / 2**30, case.note)


def test_bytes_needed_is_what_build_allocates():
    bench = _benchmark_module()
    case = bench.Case("t", [5, 40, 23], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32")
    t = bench.build(case, torch.device("cpu"))
    held = sum(x.untyped_storage().nbytes() for x in (t["k_cache"], t["v_cache"], t["k"], t["v"]))
    held += sum(k.untyped_storage().nbytes() + v.untyped_storage().nbytes() for k, v in t["per_seq"])
    assert bench.bytes_needed(case) == held


def test_a_case_that_does_not_fit_is_skipped_before_anything_is_built(monkeypatch):
    bench = _benchmark_module()
    monkeypatch.setattr(bench, "free_bytes", lambda device: 1 << 20)  # a GPU with 1 MiB free
    monkeypatch.setattr(bench, "build", lambda *a: pytest.fail("built a case that cannot fit"))
    line = bench.run_case_if_fits(bench.large_cases("float16")[1], torch.device("cpu"), "torch", None)
    assert isinstance(line, str) and "skipped" in line and "GiB" in line and "ragged" in line


def test_running_out_of_memory_midway_is_a_skip_line(monkeypatch):
    bench = _benchmark_module()
    freed = []

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(bench, "run_case", oom)
    monkeypatch.setattr(bench, "release", lambda device: freed.append(device))
    line = bench.run_case_if_fits(bench.small_cases()[0], torch.device("cpu"), "torch", None)
    assert "ran out of GPU memory" in line and freed


def test_check_case_reports_the_difference_and_refuses_a_wrong_kernel(monkeypatch):
    bench = _benchmark_module()
    case = bench.Case("t", [5, 40, 23], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32")
    assert bench.check_case(case, torch.device("cpu"), "torch") < 1e-5
    monkeypatch.setattr(bench, "paged_attention", lambda q, *a, **k: torch.zeros_like(q))
    with pytest.raises(AssertionError, match="differs from SDPA"):
        bench.check_case(case, torch.device("cpu"), "torch")


def test_measured_figures_are_none_until_a_gpu_run_records_them(tmp_path):
    bench = _benchmark_module()
    assert bench.measured_figures(tmp_path / "none.json") is None
    (tmp_path / "m.json").write_text(json.dumps({"device": "X", "results": []}))
    assert bench.measured_figures(tmp_path / "m.json")["device"] == "X"
