# expect: batch_slots
def admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots):
    """Forgets that the batch is bounded."""
    admitted = 0
    for need in prompt_blocks:
        if free_blocks - need < watermark * total_blocks:
            break
        free_blocks -= need
        admitted += 1
    return admitted
