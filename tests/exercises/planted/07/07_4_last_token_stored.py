# expect: its newest sampled token has not been fed back yet
import math


def preemption_cost(prompt_len, num_generated, block_size, mode):
    """Counts the newest sampled token as already in the cache."""
    held = math.ceil((prompt_len + num_generated) / block_size)
    if mode == "recompute":
        tokens = prompt_len + num_generated
        return {"freed_blocks": held, "blocks_copied": 0, "prefill_tokens": tokens,
                "blocks_on_resume": math.ceil(tokens / block_size)}
    return {"freed_blocks": held, "blocks_copied": 2 * held, "prefill_tokens": 0, "blocks_on_resume": held}
