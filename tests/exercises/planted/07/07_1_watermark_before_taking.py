# expect: before this request takes its own
def admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots):
    """Checks the watermark on what is free before the request takes its blocks."""
    admitted = 0
    for need in prompt_blocks:
        if admitted == batch_slots or need > free_blocks or free_blocks < watermark * total_blocks:
            break
        free_blocks -= need
        admitted += 1
    return admitted
