# expect: with no salt your message is that of a salt with other tokens
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def salted_block_key(parent_key, token_ids, extra_key=None):
    """Root, framed salt and 8-byte tokens, but None writes no salt part at all (b"" is framed as length 0)."""
    message = bytearray(bytes(32) if parent_key is None else parent_key)
    if extra_key is not None:
        message += len(extra_key).to_bytes(8, "little") + extra_key
    for token in token_ids:
        message += int(token).to_bytes(8, "little", signed=True)
    return hashlib.sha256(bytes(message)).digest()
