# expect: the root, the parent and the tokens are right; the salt's part of your message is written another way
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def salted_block_key(parent_key, token_ids, extra_key=None):
    """Root, a salt framed by its length in 4 bytes (0 for none), and 8-byte tokens."""
    message = bytearray(bytes(32) if parent_key is None else parent_key)
    salt = extra_key or b""
    message += len(salt).to_bytes(4, "little") + salt
    for token in token_ids:
        message += int(token).to_bytes(8, "little", signed=True)
    return hashlib.sha256(bytes(message)).digest()
