# expect: a rewrite, not a repair
def read_tokens(k_cache, table, num_tokens, positions):
    """A correct reader written anew with tensor indexing: it never looks at the given code."""
    wanted = torch.as_tensor(list(positions), dtype=torch.long)
    if bool(((wanted < 0) | (wanted >= num_tokens)).any()):
        bad = int(wanted[(wanted < 0) | (wanted >= num_tokens)][0])
        raise ValueError(f"position {bad} is not one of the sequence's {num_tokens} tokens")
    size = k_cache.shape[2]
    blocks = torch.as_tensor(list(table), dtype=torch.long)[wanted // size] if len(wanted) else wanted
    return k_cache[blocks, :, wanted % size, :].clone()
