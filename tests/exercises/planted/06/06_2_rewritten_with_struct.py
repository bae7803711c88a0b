# expect: a rewrite, not a repair
def salted_block_key(parent_key, token_ids, extra_key=None):
    """A correct key written anew with struct and an incremental hash: it never looks at the given code."""
    import struct

    h = hashlib.sha256()
    h.update(bytes(32) if parent_key is None else bytes(parent_key))
    salt = b"" if not extra_key else bytes(extra_key)
    h.update(struct.pack("<Q", len(salt)))
    h.update(salt)
    h.update(struct.pack(f"<{len(token_ids)}q", *[int(t) for t in token_ids]))
    return h.digest()
