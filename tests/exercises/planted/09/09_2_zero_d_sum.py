# expect: the state's shapes were not kept
@triton.jit
def fold_tile(m_i, l_i, acc, scores, v):
    """Fold one tile: right numbers, but the sum of weights comes back 0-d."""
    top = tl.maximum(tl.max(scores, 0), m_i)
    base = tl.where(top > float("-inf"), top, 0.0)
    weights = tl.exp(scores - base)
    shrink = tl.exp(m_i - base)
    total = tl.sum(l_i * shrink, 0) + tl.sum(weights, 0)  # reduced to 0-d
    return top, total, acc * shrink + tl.sum(v * weights[:, None], 0)
