"""Write or check the course's setup cell in notebooks: see :mod:`paged_kv_course.setup_cell`."""

from __future__ import annotations

import sys

from paged_kv_course import setup_cell as _module

globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})

if __name__ == "__main__":
    sys.exit(_module.main())
