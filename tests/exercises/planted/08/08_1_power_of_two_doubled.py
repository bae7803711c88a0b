# expect: stays itself
def reservation_slots(kind, prompt_len, output_len, max_len):
    """Takes 32 output tokens to 64."""
    if kind not in ("orca-max", "orca-pow2", "orca-oracle"):
        raise ValueError(f"unknown reservation kind {kind!r}")
    if prompt_len < 1 or output_len < 1:
        raise ValueError("a request has a prompt and at least one output token")
    if kind == "orca-max":
        return max_len
    if kind == "orca-oracle":
        return prompt_len + output_len
    return min(prompt_len + (1 << output_len.bit_length()), max_len)
