"""paged_kv_lib: paged KV-cache memory management, the library the paged-kv course builds.

The bookkeeping (blocks, block tables, the free queue, the block manager) needs nothing but Python;
the allocator adds the K/V tensors (torch).
Heavier parts (attention kernels, the engine, simulations, widgets, grading) live in
submodules imported on demand.
"""

from .block import Block, BlockTable, blocks_needed, cdiv
from .errors import (
    BlocksInUseError,
    CacheNotAllocatedError,
    DuplicateSequenceError,
    EmptyFreeQueueError,
    InvalidArgumentError,
    InvalidTypeError,
    InvariantError,
    OutOfBlocksError,
    PagedKVError,
    PositionError,
    SequenceStateError,
    UnknownSequenceError,
)
from .block_manager import AllocatorStats, BlockManager, FreeBlockQueue
from .prefix_cache import block_key, chain_keys

__version__ = "0.1.0"

_NEED_TORCH = {"PagedKVCacheAllocator": ".allocator"}


def __getattr__(name: str):  # the allocator imports torch: loaded on first use, so `paged-kv doctor` runs without it
    if name in _NEED_TORCH:
        import importlib

        value = getattr(importlib.import_module(_NEED_TORCH[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AllocatorStats",
    "Block",
    "BlockManager",
    "BlocksInUseError",
    "BlockTable",
    "CacheNotAllocatedError",
    "DuplicateSequenceError",
    "EmptyFreeQueueError",
    "FreeBlockQueue",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvariantError",
    "OutOfBlocksError",
    "PagedKVCacheAllocator",
    "PagedKVError",
    "PositionError",
    "SequenceStateError",
    "block_key",
    "blocks_needed",
    "cdiv",
    "chain_keys",
    "UnknownSequenceError",
    "__version__",
]
