# expect: the reserve came out one block larger than the task's
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
from fractions import Fraction


def plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots):
    """Rounds the exact value of the watermark up (0.1 is a little more than 1/10 in binary)."""
    if block_size < 1 or batch_slots < 0 or not 0 <= free_blocks <= total_blocks or not 0 <= watermark <= 1:
        raise ValueError("bad pool or batch")
    if any(tokens < 0 for tokens in prompt_tokens):
        raise ValueError("a prompt length is negative")
    reserve = math.ceil(Fraction(watermark) * total_blocks)
    admitted, rejected = [], []
    for position, tokens in enumerate(prompt_tokens):
        blocks = cdiv(tokens, block_size)
        if blocks + reserve > total_blocks:
            rejected.append(position)
        elif len(admitted) < batch_slots and free_blocks - blocks >= reserve:
            free_blocks -= blocks
            admitted.append(position)
        else:
            break
    return admitted, rejected
