"""Will it fit? The memory a command is about to ask for, checked against what the machine has.

Commands that size their work from arguments (``paged-kv simulate``, ``paged-kv
generate``) estimate the bytes first and refuse, with one line, a request that could not
be held, instead of allocating until the operating system kills the process.
"""

from __future__ import annotations

import os
from typing import Optional

# Only this share of the available memory may be planned for: the interpreter, torch and
# the operating system need the rest.
USABLE_SHARE = 0.8


class TooLargeError(ValueError):
    """The work asked for needs more memory than the machine has available."""


def available_bytes() -> Optional[int]:
    """Memory available to this process now: ``MemAvailable`` (Linux), capped by a cgroup or
    address-space limit; ``None`` where it cannot be read."""
    found: Optional[int] = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if found is None and hasattr(os, "sysconf"):
        try:
            found = int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            found = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            found = int(text) if found is None else min(found, int(text))
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY and soft > 0:
            found = soft if found is None else min(found, soft)
    except (ImportError, OSError, ValueError):
        pass
    return found


def human(num_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1 (``1.5 GiB``)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{value:.1f} TiB"


def ensure_fits(needed: int, what: str, available: Optional[int] = None) -> None:
    """Raise :class:`TooLargeError` when ``needed`` bytes for ``what`` exceed the usable memory."""
    have = available_bytes() if available is None else available
    if have is None:
        return
    usable = int(have * USABLE_SHARE)
    if needed > usable:
        raise TooLargeError(
            f"{what} needs about {human(needed)}, more than the {human(usable)} this machine can give it "
            f"({human(have)} available); ask for less"
        )
