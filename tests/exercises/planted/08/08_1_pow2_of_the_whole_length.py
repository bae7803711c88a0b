# expect: the whole length was rounded up, prompt included
def reservation_slots(kind, prompt_len, output_len, max_len):
    """Rounds prompt and output together up to a power of two."""
    if kind not in ("orca-max", "orca-pow2", "orca-oracle"):
        raise ValueError(f"unknown reservation kind {kind!r}")
    if prompt_len < 1 or output_len < 1:
        raise ValueError("a request has a prompt and at least one output token")
    if kind == "orca-max":
        return max_len
    if kind == "orca-oracle":
        return prompt_len + output_len
    return min(1 << (prompt_len + output_len - 1).bit_length(), max_len)
