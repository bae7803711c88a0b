# expect: the free count never went down
def admit_fcfs(prompt_blocks, free_blocks, total_blocks, watermark, batch_slots):
    """Weighs every request against the same free count."""
    admitted = 0
    for need in prompt_blocks:
        if admitted == batch_slots or free_blocks - need < watermark * total_blocks:
            break
        admitted += 1
    return admitted
