"""Check of task 06.2: the block key, byte for byte the library's, judged part by part.

The parts are tried in order (root, tokens, parent, salt), each on inputs that exercise it
once the parts before it are right, so a difference names the first part that differs and
the property it breaks, not the bytes to write. Expected keys come from the library's
:func:`~paged_kv_lib.prefix_cache.block_key`.
"""

from __future__ import annotations

import random
from typing import Callable, List, Optional, Tuple

from ..prefix_cache import block_key
from ._common import call_learner, fail, passed

Case = Tuple[Optional[bytes], List[int], Optional[bytes]]

#: The test vectors the task text shows (each computed by the library here, never stored).
KEY_VECTORS: List[Case] = [
    (None, [], None),
    (None, [1, 2, 3], None),
    (None, [-1], None),
    (bytes(range(32)), [7, 300], None),
    (None, [1, 2, 3], b"lora-2"),
]

# The parts of the key, each with inputs that exercise it alone (given that the parts before it are right).
_KEY_PARTS: List[Tuple[str, List[Case]]] = [
    ("the root (property 2): the key of a first block (parent None) with no tokens and no salt",
     [(None, [], None), (bytes(32), [], None)]),
    ("the tokens (property 4): how one token id is written (try ids past 2**31, negative ids, the byte order)",
     [(None, [1], None), (None, [1, 2, 3], None), (None, [0], None), (None, [-1], None), (None, [2 ** 40], None),
      (None, [256], None), (None, [1, 0], None), (None, [-(2 ** 63)], None), (None, [2 ** 63 - 1], None)]),
    ("the parent (property 2): how a parent key goes into its child's key",
     [(bytes(range(32)), [], None), (bytes(range(32)), [7, 300], None), (block_key(None, [5]), [6], None)]),
    ("the salt (property 3): an empty salt must give the key of no salt at all",
     [(None, [], b""), (None, [1, 2], b""), (bytes(range(32)), [7], b"")]),
    ("the salt (property 3): a salt must never read as another salt with other tokens",
     [(None, [], b"x"), (None, [1, 2, 3], b"lora-2"), (None, [1], b"ab"), (None, [], b"\x00" * 9),
      (block_key(None, [5]), [6], bytes(range(9)))]),
]


def _show_key_call(parent: Optional[bytes], tokens: List[int], salt: Optional[bytes]) -> str:
    shown = "None" if parent is None else ("bytes(32)" if parent == bytes(32) else f"<key {parent.hex()[:8]}...>")
    return f"salted_block_key({shown}, {tokens}" + (f", extra_key={salt!r})" if salt is not None else ")")


def _expect_key(fn: Callable[..., bytes], case: Case, part: str) -> None:
    parent, tokens, salt = case
    want = block_key(parent, tokens, salt)
    call = _show_key_call(parent, tokens, salt)
    args = (parent, list(tokens)) if salt is None else (parent, list(tokens), salt)
    got = call_learner(fn, args, call, want.hex())
    if type(got) is not bytes:
        raise fail(call, want.hex(), got, "property 1: return the digest itself, 32 bytes (bytes), not text or a hash object")
    if len(got) != 32:
        raise fail(call, want.hex(), got.hex(), f"property 1: a key is a SHA-256 digest, 32 bytes; yours has {len(got)}")
    if got != want:
        if _reordered(got, case):
            part = "the order of the parts: each part is right, but the message holds them in another order"
        raise fail(call, want.hex(), got.hex(), f"the first part that differs: {part}")


def _reordered(got: bytes, case: Case) -> bool:
    """Whether ``got`` hashes the key's three parts, each right, in another order."""
    from hashlib import sha256
    from itertools import permutations

    parent, tokens, salt = case
    framed = len(salt).to_bytes(8, "little") + salt if salt else b""
    parts = [parent if parent is not None else bytes(32), framed,
             b"".join(t.to_bytes(8, "little", signed=True) for t in tokens)]
    return any(sha256(b"".join(order)).digest() == got for order in permutations(parts))


def check_salted_block_key(salted_block_key: Callable[..., bytes]) -> None:
    """Task 06.2: ``salted_block_key(parent_key, token_ids, extra_key=None)`` equals the library's key byte for
    byte; the parts are checked in order, so a difference names the first part (and property) that differs."""
    for part, cases in _KEY_PARTS:
        for case in cases:
            _expect_key(salted_block_key, case, part)
    rng = random.Random(62)
    for _ in range(40):
        parent = None if rng.random() < 0.3 else bytes(rng.randrange(256) for _ in range(32))
        tokens = [rng.randrange(-5, 70000) for _ in range(rng.randrange(0, 17))]
        salt = rng.choice([None, b"", b"t:" + bytes([rng.randrange(256)]) * rng.randrange(1, 12)])
        _expect_key(salted_block_key, (parent, tokens, salt), "the whole key, on a random block (all parts together)")
    passed("06.2")
