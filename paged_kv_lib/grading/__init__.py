"""Exercise checks and the notebook grader.

Each exercise notebook ``exercises/NN_topic.ipynb`` has check cells that call a function
from here, ``check_<task>(...)``. A check runs the learner's code on several cases and
raises ``AssertionError`` with a message the learner can act on (the call, what was
expected, what came back, a hint); on success it prints one fixed line.

Check functions live in ``checks_NN.py`` modules (one per lesson); every public
``check_*`` name in them is re-exported here.
"""

from __future__ import annotations

import importlib
import pkgutil

from ._common import PASS_PREFIX, passed

__all__ = ["PASS_PREFIX", "passed"]

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name.startswith("checks_"):
        _module = importlib.import_module(f"{__name__}.{_info.name}")
        for _name in dir(_module):
            if _name.startswith("check_"):
                globals()[_name] = getattr(_module, _name)
                __all__.append(_name)
