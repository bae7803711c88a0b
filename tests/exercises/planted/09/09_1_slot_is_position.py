# expect: the slot is the position itself
@triton.jit
def tile_addresses(table_row_ptr, pos, seq_len, head, table_width, num_blocks,
                   stride_kb, stride_kh, stride_kt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Element offsets of the key rows of one tile's positions for query head `head`, and which may be read."""
    logical = pos // BLOCK_SIZE
    inside = (pos < seq_len) & (logical < table_width)
    physical = tl.load(table_row_ptr + logical, mask=inside, other=-1).to(tl.int64)
    kv_head = head // GROUP
    rows = physical * stride_kb + kv_head * stride_kh + pos * stride_kt
    return rows, inside & (physical >= 0) & (physical < num_blocks)
