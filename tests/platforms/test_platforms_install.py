"""A learner-sized install: ``make lab`` installs the learner extras only, ``make install
TORCH_SPEC=...`` replaces a torch that does not match (scripts/ensure_torch.py), and the
ipywidgets requirement admits Google Colab's 7.7.1."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ensure_torch", ROOT / "scripts" / "ensure_torch.py")
ensure_torch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ensure_torch)
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _requirement(name: str) -> Requirement:
    return next(r for r in map(Requirement, PROJECT["dependencies"]) if r.name == name)


def test_ipywidgets_admits_colabs_7_7_1_and_todays_8():
    widgets = _requirement("ipywidgets")
    assert widgets.specifier.contains("7.7.1") and widgets.specifier.contains("8.1.5")
    assert not widgets.specifier.contains("7.6.5")


def test_the_learner_extras_hold_no_dev_tools():
    extras = PROJECT["optional-dependencies"]
    learner = {Requirement(r).name for name in ("lab", "triton") for r in extras[name]}
    dev_tools = {Requirement(r).name for r in extras["dev"]} - {"paged-kv"}
    assert learner and not learner & dev_tools


def _dry_run(*args: str) -> str:
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@needs_make
def test_make_lab_installs_lab_and_triton_not_dev():
    # -W pyproject.toml: as if it had changed, so the install recipes are printed even on a set-up machine.
    plan = _dry_run("-W", "pyproject.toml", "lab")
    assert '-e ".[lab,triton]" -e ./course' in plan and ".[dev]" not in plan
    assert "jupyter lab" in plan


@needs_make
def test_make_test_still_installs_the_dev_tools():
    assert '-e ".[dev]"' in _dry_run("-W", "pyproject.toml", "test")


@needs_make
def test_a_torch_spec_on_the_command_line_is_checked_even_when_installed():
    plan = _dry_run("install", "TORCH_SPEC=torch")
    assert 'ensure_torch.py --explicit "torch"' in plan
    assert "--explicit" not in _dry_run("install")


@pytest.mark.parametrize("spec, have, explicit, cpu_only, gpu, replaced", [
    ("torch==2.13.0", None, False, False, False, "no torch installed"),
    ("torch==2.13.0", "2.13.0+cpu", False, True, True, None),  # the default spec keeps what is there
    ("torch==2.13.0", "2.12.1", False, False, False, "does not satisfy"),
    ("torch>=2.1,<3", "2.13.0", True, False, True, None),  # a CUDA build on a GPU machine
    ("torch", "2.13.0+cpu", True, True, True, "CPU-only build"),  # make install TORCH_SPEC=torch on a GPU
    ("torch", "2.13.0+cpu", True, True, False, None),  # ... on a machine without one
    ("torch==2.13.0+cpu", "2.13.0+cu128", False, False, True, "does not satisfy"),
    ("torch==2.13.0+cpu", "2.13.0+cpu", True, True, True, None),
])
def test_which_torch_is_replaced(spec, have, explicit, cpu_only, gpu, replaced):
    why = ensure_torch.why_replace(Requirement(spec), Version(have) if have else None, explicit, cpu_only, gpu)
    if replaced is None:
        assert why is None
    else:
        assert why is not None and replaced in why


def test_the_installed_torch_is_read_without_importing_it():
    have = ensure_torch.installed_torch()
    assert have is not None
    code = "import sys; sys.path.insert(0, 'scripts'); import ensure_torch; ensure_torch.torch_is_cpu_only(); " \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_spec_that_is_not_torch_is_refused():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ensure_torch.py"), "numpy"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "must name torch" in done.stderr
