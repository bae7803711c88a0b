# expect: the first part that differs: the tokens
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def salted_block_key(parent_key, token_ids, extra_key=None):
    """SHA-256 over the parent key (the root key when None), the length-framed salt, and the tokens."""
    message = bytearray(bytes(32) if parent_key is None else parent_key)
    salt = extra_key or b""
    message += len(salt).to_bytes(8, "little") + salt
    for token in token_ids:
        message += int(token).to_bytes(8, "big", signed=True)
    return hashlib.sha256(bytes(message)).digest()
