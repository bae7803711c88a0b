"""Install torch into this Python when it is missing or does not match the requested one.

    python scripts/ensure_torch.py [--explicit] SPEC [-- PIP_ARGS...]

``make install`` runs it before installing the course. SPEC is a requirement such as
``torch==2.13.0`` or ``torch``; PIP_ARGS go to pip (for instance ``--index-url`` of PyTorch's
CPU wheels, from the install selector on PyTorch's site). A torch already there is kept when
its version satisfies SPEC (``==2.13.0+cpu`` also names the build, exactly).
With ``--explicit`` (SPEC was given on make's command line) a CPU-only torch is also replaced
when an NVIDIA GPU is visible and SPEC does not ask for ``+cpu``: that is what
``make install TORCH_SPEC=torch`` on a GPU machine means. It prints one line saying what it did.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import List, Optional, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version


def installed_torch() -> Optional[Version]:
    try:
        return Version(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return None


def torch_is_cpu_only() -> bool:
    """Whether the installed torch was built without CUDA, read from ``torch/version.py``
    without importing torch (a second or two)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    text = version_file.read_text() if version_file.is_file() else ""
    found = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*(.+)$", text, re.MULTILINE)
    return found is not None and found.group(1).strip() == "None"


def gpu_visible() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def why_replace(requirement: Requirement, have: Optional[Version], explicit: bool,
                cpu_only: bool, gpu: bool) -> Optional[str]:
    """Why the installed torch must be (re)installed for ``requirement``, or None to keep it."""
    if have is None:
        return "no torch installed"
    if not requirement.specifier.contains(have, prereleases=True):
        return f"torch {have} does not satisfy {requirement}"
    # A build named in the spec (==2.13.0+cpu) was checked above: == with a local label is exact.
    wanted_builds = {Version(s.version).local for s in requirement.specifier if "+" in s.version}
    if explicit and gpu and cpu_only and "cpu" not in wanted_builds:
        return f"torch {have} is a CPU-only build and this machine has an NVIDIA GPU"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    pip_args: List[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, pip_args = args_in[:cut], args_in[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--explicit", action="store_true", help="SPEC was asked for, not the default")
    parser.add_argument("spec")
    args = parser.parse_args(args_in)
    try:
        requirement = Requirement(args.spec)
    except InvalidRequirement as exc:
        print(f"ensure_torch: TORCH_SPEC {args.spec!r} is not a requirement: {exc}", file=sys.stderr)
        return 2
    if requirement.name.lower() != "torch":
        print(f"ensure_torch: TORCH_SPEC {args.spec!r} must name torch", file=sys.stderr)
        return 2
    have = installed_torch()
    why = why_replace(requirement, have, args.explicit, have is not None and torch_is_cpu_only(), gpu_visible())
    if why is None:
        print(f"ensure_torch: torch {have} matches {args.spec}: kept")
        return 0
    print(f"ensure_torch: {why}: installing {args.spec}", flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", *pip_args, args.spec]
    if have is not None:
        cmd[4:4] = ["--force-reinstall", "--no-deps"] if requirement.specifier.contains(have, prereleases=True) \
            else []
    done = subprocess.run(cmd)
    if done.returncode == 0 and have is not None and "--no-deps" in cmd:
        # --no-deps kept pip from reinstalling numpy and friends; fetch what the new build adds (CUDA libraries).
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *pip_args, args.spec])
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
