# expect: the cap is missing
def reservation_slots(kind, prompt_len, output_len, max_len):
    """Forgets that no region is longer than the model's maximum length."""
    if kind not in ("orca-max", "orca-pow2", "orca-oracle"):
        raise ValueError(f"unknown reservation kind {kind!r}")
    if prompt_len < 1 or output_len < 1:
        raise ValueError("a request has a prompt and at least one output token")
    if kind == "orca-max":
        return max_len
    if kind == "orca-oracle":
        return prompt_len + output_len
    return prompt_len + (1 << (output_len - 1).bit_length())
