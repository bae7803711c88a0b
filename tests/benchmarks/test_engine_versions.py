"""``benchmarks/engine_versions.py``: two trees' engines in alternating child processes, refused when they differ."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "engine_versions.py"


def _module():
    spec = importlib.util.spec_from_file_location("engine_versions_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tree_against_itself_prints_rounds_and_a_paired_median():
    result = subprocess.run([sys.executable, str(SCRIPT), str(ROOT), "--rounds", "1", "--only", "2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"round 1: workload 2: [\d,]+ -> [\d,]+ tok/s", lines[0])
    ratio = float(re.search(r"median (\d+\.\d+)", lines[-1]).group(1))
    assert 0.2 < ratio < 5


def test_trees_whose_workloads_or_tokens_differ_are_refused(monkeypatch):
    module = _module()
    answers = iter([({0: 100.0}, "digest of one"), ({0: 100.0}, "digest of another")])
    monkeypatch.setattr(module, "one_side", lambda tree, workloads: next(answers))
    with pytest.raises(SystemExit, match="differ in their workloads or in the tokens"):
        module.main([str(ROOT), "--rounds", "1", "--only", "0"])
