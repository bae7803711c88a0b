# expect: the best measured B=
def choose_block_size(requests, capacity_tokens, speed):
    """vLLM's default, whatever the workload."""
    return 16
