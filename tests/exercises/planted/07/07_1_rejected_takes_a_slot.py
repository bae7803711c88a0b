# expect: a rejected request used a batch slot
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
def plan_admission(prompt_tokens, block_size, free_blocks, total_blocks, watermark, batch_slots):
    """Counts a rejected request against the batch slots."""
    if block_size < 1 or batch_slots < 0 or not 0 <= free_blocks <= total_blocks or not 0 <= watermark <= 1:
        raise ValueError("bad pool or batch")
    if any(tokens < 0 for tokens in prompt_tokens):
        raise ValueError("a prompt length is negative")
    reserve = math.ceil(watermark * total_blocks)
    admitted, rejected = [], []
    for position, tokens in enumerate(prompt_tokens):
        blocks = cdiv(tokens, block_size)
        if blocks + reserve > total_blocks and len(admitted) + len(rejected) < batch_slots:
            rejected.append(position)
        elif len(admitted) + len(rejected) < batch_slots and free_blocks - blocks >= reserve:
            free_blocks -= blocks
            admitted.append(position)
        else:
            break
    return admitted, rejected
