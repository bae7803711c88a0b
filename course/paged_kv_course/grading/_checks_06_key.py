"""Check of task 06.2: the block key, byte for byte the task's format, judged part by part.

The parts are tried in order (root, tokens, parent, salt), each on inputs that exercise it
once the parts before it are right, so a difference names the first part that differs and
the property it breaks, not the bytes to write. Expected keys come from :func:`reference_key`,
the task's format, which is the library's :func:`~paged_kv_lib.prefix_cache.block_key`: the salt
is always framed (its length, 0 for none, then its bytes), so that no salt never reads as a salt
whose length is a multiple of 8. (The library's key wrote nothing for no salt, and so had that
collision, until a learner found it in this task.)
"""

from __future__ import annotations

import hashlib
import random
from typing import Callable, List, Optional, Tuple

from paged_kv_lib.prefix_cache import block_key
from ._common_given import GIVEN
from ._common_repair import check_repair
from ._common import call_learner, fail, passed

Case = Tuple[Optional[bytes], List[int], Optional[bytes]]


def _parts(parent: Optional[bytes], tokens: List[int], salt: Optional[bytes]) -> List[bytes]:
    """The three parts of the task's message, in order: parent (root when None), framed salt, tokens."""
    salt = salt or b""
    return [bytes(32) if parent is None else parent, len(salt).to_bytes(8, "little") + salt,
            b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens)]


def reference_key(parent: Optional[bytes], tokens: List[int], salt: Optional[bytes] = None) -> bytes:
    """The task's key: SHA-256 over the parent key, the salt framed by its length (always), the 8-byte tokens."""
    return block_key(parent, tokens, salt)


_TENANT = int.from_bytes(b"tenant-7", "little", signed=True)  # the 8 bytes of b"tenant-7" read as one token id

#: Pairs of inputs that share one message when no salt writes nothing: the first when a given salt is framed
#: (its length, 8, reads as a token), the second when it is not.
COLLISIONS: List[Tuple[Case, Case]] = [((None, [5], b"tenant-7"), (None, [8, _TENANT, 5], None)),
                                       ((None, [5], b"tenant-7"), (None, [_TENANT, 5], None))]

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
     [(bytes(range(32)), [], None), (bytes(range(32)), [7, 300], None), (reference_key(None, [5]), [6], None)]),
    ("the salt (property 3): an empty salt must give the key of no salt at all",
     [(None, [], b""), (None, [1, 2], b""), (bytes(range(32)), [7], b"")]),
    ("the salt (property 3): a salt must never read as another salt with other tokens",
     [(None, [], b"x"), (None, [1, 2, 3], b"lora-2"), (None, [1], b"ab"), (None, [], b"\x00" * 9),
      (reference_key(None, [5]), [6], bytes(range(9)))]),
    ("the salt (property 3): no salt must never read as a salt with other tokens",
     [case for pair in COLLISIONS for case in pair]),
]


def _show_key_call(parent: Optional[bytes], tokens: List[int], salt: Optional[bytes]) -> str:
    shown = "None" if parent is None else ("bytes(32)" if parent == bytes(32) else f"<key {parent.hex()[:8]}...>")
    return f"salted_block_key({shown}, {tokens}" + (f", extra_key={salt!r})" if salt is not None else ")")


def _expect_key(fn: Callable[..., bytes], case: Case, part: str) -> None:
    parent, tokens, salt = case
    want = reference_key(parent, tokens, salt)
    call = _show_key_call(parent, tokens, salt)
    args = (parent, list(tokens)) if salt is None else (parent, list(tokens), salt)
    got = call_learner(fn, args, call, want.hex())
    if type(got) is not bytes:
        raise fail(call, want.hex(), got, "property 1: return the digest itself, 32 bytes (bytes), not text or a hash object")
    if len(got) != 32:
        raise fail(call, want.hex(), got.hex(), f"property 1: a key is a SHA-256 digest, 32 bytes; yours has {len(got)}")
    if got != want:
        pair = None if _reordered(got, case) else _collision(fn)
        if _reordered(got, case):
            part = "the order of the parts: each part is right, but the message holds them in another order"
        elif pair is not None:
            part = ("the salt (property 3): with no salt your message is that of a salt with other tokens: "
                    f"{_show_key_call(*pair[0])} and {_show_key_call(*pair[1])} give the same key")
        elif not part.startswith("the salt") and _only_salt_differs(got, case):
            part = ("the salt (property 3): the root, the parent and the tokens are right; the salt's part of "
                    "your message is written another way" + (" (no salt has a part too)" if not salt else ""))
        raise fail(call, want.hex(), got.hex(), f"the first part that differs: {part}")


def _collision(fn: Callable[..., bytes]) -> Optional[Tuple[Case, Case]]:
    """The first pair of :data:`COLLISIONS` that the learner's key gives one key, or None."""
    for pair in COLLISIONS:
        keys = []
        for parent, tokens, salt in pair:
            try:
                keys.append(fn(parent, list(tokens)) if salt is None else fn(parent, list(tokens), salt))
            except Exception:  # a key that raises here is judged on the case at hand, not on this pair
                return None
        if keys[0] == keys[1]:
            return pair
    return None


def _only_salt_differs(got: bytes, case: Case) -> bool:
    """Whether ``got`` hashes the right parent and tokens around a salt part written in another common way
    (left out, its length in another width or byte order, or after its bytes)."""
    parent, tokens, salt = case
    head, _, body = _parts(parent, tokens, salt)
    salt = salt or b""
    framings = [b"", salt] + [salt + len(salt).to_bytes(w, o) for w in (1, 2, 4, 8) for o in ("little", "big")]
    framings += [len(salt).to_bytes(w, o) + salt for w in (1, 2, 4, 16) for o in ("little", "big")]
    framings.append(len(salt).to_bytes(8, "big") + salt)
    return any(hashlib.sha256(head + middle + body).digest() == got for middle in framings)


def _reordered(got: bytes, case: Case) -> bool:
    """Whether ``got`` hashes the key's three parts, each right, in another order."""
    from itertools import permutations

    return any(hashlib.sha256(b"".join(order)).digest() == got for order in permutations(_parts(*case)))


def check_salted_block_key(salted_block_key: Callable[..., bytes]) -> None:
    """Task 06.2: ``salted_block_key(parent_key, token_ids, extra_key=None)`` equals the task's key byte for
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
    check_repair(GIVEN["06.2"], salted_block_key)
    passed("06.2")
