# expect: block_size 0: a block holds at least one token
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots):
    """Right for good arguments, and never refuses bad ones."""
    reserve = math.ceil(watermark * total_blocks)
    admitted, rejected = [], []
    for position, tokens in enumerate(prompt_tokens):
        blocks = -(-tokens // max(block_size, 1))
        if blocks + reserve > total_blocks:
            rejected.append(position)
        elif len(admitted) < batch_slots and free_blocks - blocks >= reserve:
            free_blocks -= blocks
            admitted.append(position)
        else:
            break
    return admitted, rejected
