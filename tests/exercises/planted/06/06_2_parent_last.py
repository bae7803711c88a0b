# expect: the order of the parts
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def salted_block_key(parent_key, token_ids, extra_key=None):
    """SHA-256 over the salt, the tokens, then the parent key."""
    message = bytearray()
    salt = extra_key or b""
    message += len(salt).to_bytes(8, "little") + salt
    for token in token_ids:
        message += int(token).to_bytes(8, "little", signed=True)
    message += bytes(32) if parent_key is None else parent_key
    return hashlib.sha256(bytes(message)).digest()
