# expect: a prompt whose last block is not full
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots):
    """Counts whole blocks only."""
    if block_size < 1 or batch_slots < 0 or not 0 <= free_blocks <= total_blocks or not 0 <= watermark <= 1:
        raise ValueError("bad pool or batch")
    if any(tokens < 0 for tokens in prompt_tokens):
        raise ValueError("a prompt length is negative")
    reserve = math.ceil(watermark * total_blocks)
    admitted, rejected = [], []
    for position, tokens in enumerate(prompt_tokens):
        blocks = tokens // block_size
        if blocks + reserve > total_blocks:
            rejected.append(position)
        elif len(admitted) < batch_slots and free_blocks - blocks >= reserve:
            free_blocks -= blocks
            admitted.append(position)
        else:
            break
    return admitted, rejected
