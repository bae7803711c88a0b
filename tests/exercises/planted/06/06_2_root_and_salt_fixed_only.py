# expect: the first part that differs: the tokens (property 4)
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def salted_block_key(parent_key, token_ids, extra_key=None):
    """Two of the three flaws repaired; the tokens are still written as the provided code writes them."""
    message = bytearray(bytes(32) if parent_key is None else parent_key)
    salt = extra_key or b""
    message += len(salt).to_bytes(8, "little") + salt
    message += array("i", token_ids).tobytes()
    return hashlib.sha256(bytes(message)).digest()
