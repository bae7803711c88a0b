# expect: too large
def choose_block_size(requests, capacity_tokens, speed):
    """The largest of the fastest block sizes: ignores what the memory loses."""
    return max(size for size in speed if speed[size] == max(speed.values()))
