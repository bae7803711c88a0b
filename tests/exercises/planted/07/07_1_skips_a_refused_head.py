# expect: head-of-line
def admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots):
    """Lets a smaller request overtake a refused one."""
    admitted = 0
    for need in prompt_blocks:
        if admitted < batch_slots and free_blocks - need >= watermark * total_blocks:
            free_blocks -= need
            admitted += 1
    return admitted
