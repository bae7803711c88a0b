# expect: a fraction of the whole pool
def admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots):
    """Takes the watermark as a share of the free blocks."""
    admitted = 0
    for need in prompt_blocks:
        if admitted == batch_slots or free_blocks - need < watermark * free_blocks:
            break
        free_blocks -= need
        admitted += 1
    return admitted
