# expect: without rescaling
def merge_softmax_states(a, b):
    """The online-softmax state of the union of two disjoint chunks of keys."""
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = torch.maximum(m_a, m_b)
    # Where both states are empty m is -inf; measure from 0 there, so both weights are exp(-inf) = 0, not NaN.
    m_ref = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a = torch.exp(m_a - m_ref)
    w_b = torch.exp(m_b - m_ref)
    return m, l_a + l_b, acc_a + acc_b
    ### END SOLUTION
