# expect: overflow
@triton.jit
def fold_tile(m_i, l_i, acc, scores, v):
    """Fold one tile's scores and values into the running (max, sum of weights, weighted sum of values)."""
    top = tl.maximum(tl.max(scores, 0), m_i)
    # With nothing visible yet top is -inf: measure from 0 instead, so every weight is exp(-inf) = 0.
    base = 0.0 * top
    weights = tl.exp(scores - base)
    shrink = tl.exp(m_i - base)  # brings what was summed against the old maximum to the new one
    return top, l_i * shrink + tl.sum(weights, 0), acc * shrink + tl.sum(v * weights[:, None], 0)
    ### END SOLUTION
