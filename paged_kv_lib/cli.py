"""The ``paged-kv`` command.

Subcommands live next to the code they drive; each such module has
``register(subparsers)`` that adds its parser and sets ``func``. A subcommand whose
module cannot be imported (torch missing or broken, say) is still listed and explains
itself when run, so ``paged-kv doctor`` works, and says what is wrong, on a broken install.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from typing import Dict, List, Optional

LIBRARY_COMMANDS = {
    "simulate": "paged_kv_lib.simulate.cli",
    "generate": "paged_kv_lib.engine.cli",
}
# Other installed packages add subcommands by naming a module under this entry-point group
# (the course package adds grade, release, gradescope and check); the library never imports them.
COMMAND_GROUP = "paged_kv.commands"


def _plugin_commands() -> Dict[str, str]:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=COMMAND_GROUP)}
    return {name: module for name, module in sorted(found.items()) if name not in LIBRARY_COMMANDS}


SUBCOMMAND_MODULES = {**LIBRARY_COMMANDS, **_plugin_commands()}


def _version(module: str) -> str:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install should be reported, not crash doctor
        return f"not installed ({type(exc).__name__})"
    return str(getattr(mod, "__version__", "installed"))


def _library_version() -> str:
    try:
        from importlib.metadata import version

        return version("paged-kv")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a bare checkout)
        return "installed"


def doctor_report() -> List[tuple]:
    """(item, value) rows describing this environment, for ``paged-kv doctor`` and lesson 00."""
    rows = [
        ("python", platform.python_version()),
        ("paged_kv_lib", _library_version()),
        ("torch", _version("torch")),
        ("triton", _version("triton")),
        ("ipywidgets", _version("ipywidgets")),
        ("jupyterlab", _version("jupyterlab")),
    ]
    try:
        import torch

        if torch.cuda.is_available():
            from .attention.api import auto_backend

            major, minor = torch.cuda.get_device_capability(0)
            backend, why = auto_backend(torch.device("cuda", 0))
            cuda = f"yes: {torch.cuda.get_device_name(0)}, sm_{major}{minor}, attention backend {backend}"
            cuda += f" ({why})" if why else ""
        else:
            cuda = "no (CPU only: kernels run under Triton's interpreter)"
    except Exception as exc:  # noqa: BLE001
        cuda = f"unknown ({exc})"
    rows.append(("cuda", cuda))
    rows.append(("widgets", _widgets_status()))
    return rows


def _widgets_status() -> str:
    """Whether ipywidgets can render in JupyterLab: the lab extension ships in jupyterlab_widgets."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "will not render: ipywidgets is not installed"
    try:
        import jupyterlab_widgets  # noqa: F401
    except ImportError:
        return "will not render in JupyterLab: jupyterlab_widgets is missing"
    return "will render (ipywidgets with its JupyterLab extension)"


def _doctor(_args: argparse.Namespace) -> int:
    rows = doctor_report()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``paged-kv`` parser; with ``only``, the modules of other subcommands are not imported
    (they pull in torch and take seconds), and those subcommands are listed by name alone."""
    parser = argparse.ArgumentParser(
        prog="paged-kv",
        description="Paged KV-cache course tools: environment check, simulations, generation, grading.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = subparsers.add_parser("doctor", help="print versions and whether CUDA and widgets work")
    doctor.set_defaults(func=_doctor)
    for command, name in SUBCOMMAND_MODULES.items():
        if only is not None and command != only:
            subparsers.add_parser(command, help=f"see `paged-kv {command} --help`")
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of the library is not present
            _register_broken(subparsers, command, exc)
            continue
        except Exception as exc:  # noqa: BLE001 - a broken dependency (torch) must not break doctor
            _register_broken(subparsers, command, exc)
            continue
        module.register(subparsers)
    return parser


def _register_broken(subparsers: argparse._SubParsersAction, command: str, exc: BaseException) -> None:
    """A subcommand that cannot load: it prints why in one line and exits 2."""
    reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
    parser = subparsers.add_parser(command, help=f"(unavailable: {reason})", add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)

    def run(_args: argparse.Namespace) -> int:
        print(f"paged-kv {command}: error: cannot load it ({reason}); run `paged-kv doctor`", file=sys.stderr)
        return 2

    parser.set_defaults(func=run)


def main(argv: Optional[List[str]] = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    command = args_in[0] if args_in and args_in[0] in SUBCOMMAND_MODULES else None
    parser = build_parser(command or ("doctor" if args_in[:1] == ["doctor"] else None))
    args = parser.parse_args(args_in)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
