"""Prefix caching: content keys for full blocks, and the table from key to block.

A full block's key is a SHA-256 digest chained over its parent block's key, an optional
extra key (a salt: a LoRA id, a tenant, an image hash), and the block's own token ids.
Chaining means equal tokens after different prefixes get different keys, because the
K/V of a token depends on everything before it. A cryptographic hash makes an accidental
collision (two different prefixes, one key) practically impossible, so a hit needs no
token comparison. Partial blocks have no key: their content is still changing.
"""

from __future__ import annotations

from hashlib import sha256
from array import array
from typing import Dict, List, Optional, Sequence, Union

from .errors import InvalidTypeError

ROOT_KEY = bytes(32)
NO_SALT = bytes(8)  # no salt, framed: a zero length


def block_key(parent_key: Optional[bytes], token_ids: Sequence[int], extra_key: Optional[bytes] = None) -> bytes:
    """The key of a full block holding ``token_ids`` after the block whose key is ``parent_key``."""
    return sha256((parent_key or ROOT_KEY) + framed(extra_key) + array("q", token_ids).tobytes()).digest()


def framed(extra_key: Optional[bytes]) -> bytes:
    """The salt as a key hashes it: always length-prefixed, 0 for none. Otherwise "no salt" would read as any
    salt whose length is a multiple of 8 (its length and bytes parsed as token ids), and a prompt could be
    made to hit another tenant's blocks."""
    return len(extra_key).to_bytes(8, "little") + extra_key if extra_key else NO_SALT


def chain_keys(token_ids: Sequence[int], block_size: int, extra_key: Optional[bytes] = None) -> List[bytes]:
    """Keys of every full block of a token sequence, in order."""
    keys: List[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        keys.append(block_key(keys[-1] if keys else None, token_ids[start : start + block_size], extra_key))
    return keys


class PrefixCache(Dict[bytes, int]):
    """Which physical block holds the content with a given key (a dict: key -> block id), and how often
    lookups hit.

    Only the allocator changes it; it keeps ``Block.block_hash`` and this map in step (a block has a
    hash exactly when the map sends that hash to it).
    """

    __slots__ = ("queries", "hits")

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0
        self.hits = 0

    def longest_prefix(self, keys: Sequence[bytes]) -> List[int]:
        """Block ids of the longest run of leading ``keys`` found in the cache, in order."""
        hits = []
        for key in keys:
            block_id = self.get(key)
            if block_id is None:
                break
            hits.append(block_id)
        return hits


def as_extra_key(extra_key: Optional[Union[bytes, str]]) -> Optional[bytes]:
    """A salt as bytes (a str is UTF-8 encoded); ``None`` stays ``None``."""
    if extra_key is None:
        return None
    if isinstance(extra_key, str):
        return extra_key.encode()
    if isinstance(extra_key, bytes):
        return extra_key
    raise InvalidTypeError(f"extra_key must be bytes or str, got {type(extra_key).__name__}")
