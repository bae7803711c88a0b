"""`pip install -e .` prints no setuptools warning (issue 34, item 8).

With its packages found through an import hook, setuptools' editable install warns about
"folders in your working directory with the same name as your package", and pip shows that
warning in a learner's first install. Both pyproject files say their packages sit at the top of
their folder (``package-dir = {"" = "."}``), so the editable wheel is a plain .pth file and no
warning is raised. Each build runs setuptools' backend on a copy of the project, offline.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = {
    "paged-kv": (ROOT, ["pyproject.toml", "README.md", "LICENSE", "paged_kv_lib"]),
    "paged-kv-course": (ROOT / "course", ["pyproject.toml", "paged_kv_course"]),
}
BUILD = """
import os, sys, warnings
warnings.simplefilter("always")
from setuptools import build_meta
print("WHEEL", build_meta.build_editable(sys.argv[1]))
"""


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_an_editable_install_raises_no_setuptools_warning(name, tmp_path):
    source, parts = PROJECTS[name]
    project = tmp_path / "project"
    project.mkdir()
    for part in parts:
        path = source / part
        if path.is_dir():
            shutil.copytree(path, project / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, project / part)
    out = tmp_path / "wheel"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=project, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Warning:" not in done.stderr and "Editable installation" not in done.stderr, done.stderr[-2000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1
