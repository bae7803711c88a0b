"""The ``paged-kv`` command around its subcommands: doctor on a broken install, generate's size check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from paged_kv_lib import cli

REPO = Path(__file__).resolve().parents[2]


def _without_torch(tmp_path: Path) -> dict:
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("torch is broken here (a test)")\n')
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), str(REPO)]))


def test_doctor_works_and_says_so_when_torch_is_broken(tmp_path):
    env = _without_torch(tmp_path)
    done = subprocess.run([sys.executable, "-m", "paged_kv_lib.cli", "doctor"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert rows["torch"].startswith("not installed (ImportError)")
    assert "torch is broken here" in rows["cuda"]
    gen = subprocess.run([sys.executable, "-m", "paged_kv_lib.cli", "generate", "hi"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)
    assert gen.returncode == 2 and gen.stderr.strip().startswith("paged-kv generate: error: cannot load it")
    assert "Traceback" not in gen.stderr and len(gen.stderr.strip().splitlines()) == 1


def test_generate_refuses_a_cache_the_machine_cannot_hold(capsys):
    assert cli.main(["generate", "hi", "--num-blocks", str(10 ** 12), "--random-weights"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("paged-kv generate: error: the KV cache") and "needs about" in err
    assert len(err.splitlines()) == 1


def test_the_generate_command_lives_with_the_engine():
    import paged_kv_lib.engine.cli as engine_cli

    assert cli.SUBCOMMAND_MODULES["generate"] == engine_cli.__name__
    assert not (REPO / "paged_kv_lib" / "engine_cli.py").exists()
