"""Binder and JupyterHub images, judged from their files (no Docker here): binder/ gives repo2docker
a CPU-only image with the learner extras, docker/Dockerfile a Jupyter stack image with the course.

``repo2docker --no-build --debug .`` (it needs no Docker) runs when the command is found: on PATH or
at ``$REPO2DOCKER``, e.g. from a throwaway venv: ``python -m venv /tmp/r2d && /tmp/r2d/bin/pip install
jupyter-repo2docker && REPO2DOCKER=/tmp/r2d/bin/repo2docker pytest tests/platforms/test_platforms_binder_docker.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
DEV_TOOLS = ("pytest", "ruff", "mypy", "hypothesis", "nbval", "transformers", "playwright")


def _conda_names(env: dict) -> list:
    return [re.split(r"[<>=! ]", d)[0] for d in env["dependencies"] if isinstance(d, str)]


def _pip_lines(env: dict) -> list:
    return [line for d in env["dependencies"] if isinstance(d, dict) for line in d.get("pip", [])]


def test_binder_environment_is_cpu_torch_and_no_dev_tools():
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    names = _conda_names(env)
    assert "pytorch-cpu" in names and "pytorch" not in names  # the CPU build, never the CUDA one
    assert "jupyterlab" in names and "ipywidgets" in names
    assert not set(names) & set(DEV_TOOLS)
    assert not any("[dev]" in line for line in _pip_lines(env))


def test_binder_post_build_installs_the_learner_extras_editable():
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK)
    text = post.read_text()
    assert '-e ".[lab,triton]" -e ./course' in text and "[dev]" not in text
    assert "--no-cache-dir" in text and "set -e" in text
    assert os.access(BINDER / "start", os.X_OK) and "TRITON_INTERPRET=1" in (BINDER / "start").read_text()


def test_the_root_environment_is_the_learners_too():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "pytorch-cpu" in _conda_names(env)
    assert _pip_lines(env) == ["-e .[lab,triton]", "-e ./course"]


BINDER_LINK = re.compile(r"https://mybinder\.org/v2/gh/[^\s`)]+")


def test_the_readme_and_the_platforms_page_give_the_same_binder_launch():
    """docs/platforms.md once pointed at a README badge that did not exist (issue 34, item 8)."""
    readme = (ROOT / "README.md").read_text()
    platforms = (ROOT / "docs" / "platforms.md").read_text()
    links = set(BINDER_LINK.findall(readme))
    assert len(links) == 1 and links == set(BINDER_LINK.findall(platforms))
    assert all("OWNER/REPO" in link and "lessons/00_setup.ipynb" in link for link in links)
    has_badge = "mybinder.org/badge" in readme
    assert has_badge or "badge in the README" not in platforms


def _repo2docker() -> str:
    found = os.environ.get("REPO2DOCKER") or shutil.which("repo2docker")
    if not found:
        pytest.skip("repo2docker is not installed here (set REPO2DOCKER to run it); binder/ was checked from its files")
    return found


@pytest.mark.timeout(300)
def test_repo2docker_builds_from_binder():
    out = subprocess.run([_repo2docker(), "--no-build", "--debug", str(ROOT)], capture_output=True, text=True,
                         timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    plan = out.stdout + out.stderr
    assert 'binder/environment.yml' in plan and "./binder/postBuild" in plan and "binder/start" in plan
    assert "[dev]" not in plan


# ------------------------------------------------------------------ docker/Dockerfile
def _instructions(path: Path) -> list:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                            if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", joined, re.MULTILINE)]


def test_dockerfile_builds_the_course_on_a_jupyter_stack_image():
    steps = _instructions(ROOT / "docker" / "Dockerfile")
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    kinds = [k for k, _ in steps]
    assert kinds.count("FROM") == 1
    base = next(a for k, a in steps if k == "FROM").replace("${BASE_IMAGE}", args.get("BASE_IMAGE", ""))
    assert re.match(r"jupyter/(minimal|scipy|base)-notebook:", base)
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert "bubblewrap" in runs and "pytorch-cpu" in runs
    assert '-e "/opt/paged-kv[lab,triton]" -e /opt/paged-kv/course' in runs and "[dev]" not in runs
    assert "exercises/solutions" in runs  # refuses a build context holding the solutions
    assert ("ENV", "TRITON_INTERPRET=1") in steps
    # The server runs as the notebook user, not root, and each learner's copy comes from the hook.
    users = [a for k, a in steps if k == "USER"]
    assert users[-1] == "${NB_UID}"
    hook = next(a for k, a in steps if k == "COPY" and "before-notebook.d" in a).split()[0]
    assert (ROOT / hook).is_file()


def test_a_build_on_the_frozen_docker_hub_base_says_so():
    """The stacks' Docker Hub names stopped updating in October 2023: a build on one warns."""
    steps = _instructions(ROOT / "docker" / "Dockerfile")
    default = next(a for k, a in steps if k == "ARG" and a.startswith("BASE_IMAGE=")).split("=", 1)[1]
    after_from = steps[[k for k, _ in steps].index("FROM") + 1:]
    assert ("ARG", "BASE_IMAGE") in after_from  # the value is visible to RUN after FROM
    if default.startswith("jupyter/"):
        warn = next(a for k, a in after_from if k == "RUN" and "BASE_IMAGE" in a)
        assert "jupyter/*" in warn and "frozen" in warn and ">&2" in warn
    assert "stopped updating" in (ROOT / "docs" / "platforms.md").read_text()


def test_the_course_copy_hook_never_overwrites_a_learners_work(tmp_path):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("needs bash")
    course = tmp_path / "opt"
    for folder in ("lessons", "exercises"):
        (course / folder).mkdir(parents=True)
        (course / folder / "a.ipynb").write_text("{}")
    hook = (ROOT / "docker" / "copy-course.sh").read_text().replace("/opt/paged-kv", str(course))
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home))
    subprocess.run([bash, "-c", hook], env=env, check=True, capture_output=True)
    mine = home / "paged-kv" / "lessons" / "a.ipynb"
    assert mine.read_text() == "{}"
    mine.write_text("my work")
    subprocess.run([bash, "-c", hook], env=env, check=True, capture_output=True)
    assert mine.read_text() == "my work"
