# expect: not a Triton kernel: the task's point is the @triton.jit function
class _Launchable:
    """Answers kernel[grid] like a kernel, then computes the decode in torch: no Triton at all."""

    def __getitem__(self, grid):
        def run(q, k_cache, v_cache, table, lens, out, part_acc, part_max, part_sum, scale, num_blocks, max_blocks,
                num_q_heads, *strides, GROUP, HEAD_DIM, BLOCK_SIZE, **constants):
            for i in range(q.shape[0]):
                n = int(lens[i])
                ids = [int(table[i, p // BLOCK_SIZE]) for p in range(n)]
                keep = [p for p, b in zip(range(n), ids) if 0 <= b < num_blocks - 1]
                for h in range(q.shape[1]):
                    if not keep:
                        out[i, h] = 0
                        continue
                    keys = torch.stack([k_cache[ids[p], h // GROUP, p % BLOCK_SIZE] for p in keep]).float()
                    vals = torch.stack([v_cache[ids[p], h // GROUP, p % BLOCK_SIZE] for p in keep]).float()
                    w = torch.softmax(keys @ q[i, h].float() * scale, 0)
                    out[i, h] = (w @ vals).to(out.dtype)
        return run


paged_decode_kernel = _Launchable()
merge_splits_kernel = _Launchable()
