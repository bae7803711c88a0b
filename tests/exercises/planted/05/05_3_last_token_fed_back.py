# expect: never fed back
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
@torch.no_grad()
def paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    """Greedy decoding of one sequence whose prompt is prefilled in chunks; returns the new token ids."""
    allocator.allocate_for_sequence(seq_id, 0)
    for start in range(0, len(prompt_ids), chunk_size):
        chunk = list(prompt_ids[start:start + chunk_size])
        allocator.append_tokens(seq_id, len(chunk))
        logits = model.forward_paged(allocator, [seq_id], [chunk])
    produced = []
    for _ in range(max_new_tokens):
        produced.append(int(logits[0].argmax()))
        allocator.append_tokens(seq_id)
        logits = model.forward_paged(allocator, [seq_id], [[produced[-1]]])
    return produced
