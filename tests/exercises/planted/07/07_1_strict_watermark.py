# expect: exactly watermark * total_blocks
def admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots):
    """Refuses a request that would leave exactly the watermark free."""
    admitted = 0
    for need in prompt_blocks:
        if admitted == batch_slots or free_blocks - need <= watermark * total_blocks:
            break
        free_blocks -= need
        admitted += 1
    return admitted
