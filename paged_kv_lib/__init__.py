"""paged_kv_lib: paged KV-cache memory management, the library the paged-kv course builds.

The core (blocks, block tables, the free queue and the allocator) needs only torch.
Heavier parts (attention kernels, the engine, simulations, widgets, grading) live in
submodules imported on demand.
"""

from .allocator import AllocatorStats, PagedKVCacheAllocator
from .block import Block, blocks_needed, cdiv
from .block_table import BlockTable
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
from .free_queue import FreeBlockQueue
from .prefix_cache import block_key, chain_keys

__version__ = "0.1.0"

__all__ = [
    "AllocatorStats",
    "Block",
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
