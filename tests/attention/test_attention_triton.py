"""The Triton kernels against SDPA: on the CPU interpreter (small cases) and on CUDA (big ones)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from paged_kv_lib.attention import paged_attention, paged_attention_extend, triton_kernel  # noqa: E402
from paged_kv_lib.attention.testing import (  # noqa: E402
    TOLERANCES,
    make_paged_batch,
    sdpa_decode,
    sdpa_extend,
)
from paged_kv_lib.attention.triton_kernel import (  # noqa: E402
    MAX_SPLITS,
    choose_num_splits,
    is_interpreting,
    max_merge_splits,
    paged_attention_extend_triton,
    paged_attention_triton,
    plan_decode,
    plan_extend,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Each new shape compiles a kernel on a GPU (0.7 to 30 s on sm_90, and gpu_check gives
# all attention tests under three minutes); the interpreter has no compile step but runs
# slowly. So a GPU gets few examples, the CPU a modest number.
DECODE_EXAMPLES = 6 if torch.cuda.is_available() else 25
EXTEND_EXAMPLES = 4 if torch.cuda.is_available() else 20


def assert_matches(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[dtype])


def decode(batch, **kwargs):
    return paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="triton", **kwargs
    )


def extend(batch, **kwargs):
    return paged_attention_extend(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, backend="triton", **kwargs,
    )


@st.composite
def kernel_shapes(draw, max_len: int = 96):
    num_kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    return dict(
        seq_lens=draw(st.lists(st.integers(1, max_len), min_size=1, max_size=3)),
        num_kv_heads=num_kv_heads,
        num_q_heads=num_kv_heads * group,
        head_dim=draw(st.sampled_from([16, 32, 48, 64, 80, 128])),
        block_size=draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256])),
        dtype=draw(st.sampled_from(DTYPES)),
        spare_blocks=draw(st.integers(0, 2)),
        pad_columns=draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 2**16)),
        device=DEVICE,
    )


# --------------------------------------------------------------------------- decode
@settings(max_examples=DECODE_EXAMPLES, deadline=None)
@given(shape=kernel_shapes(), num_splits=st.sampled_from([None, 1, 2, 4]))
def test_triton_decode_matches_sdpa(shape, num_splits):
    batch = make_paged_batch(**shape)
    assert_matches(decode(batch, num_splits=num_splits), sdpa_decode(batch), shape["dtype"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_counts_agree(dtype):
    """More splits than the context needs leaves empty splits; the merge must ignore them."""
    batch = make_paged_batch([200, 17, 1], num_q_heads=2, num_kv_heads=1, head_dim=32, block_size=16, dtype=dtype, device=DEVICE)
    expected = sdpa_decode(batch)
    for num_splits in (1, 2, 32):
        assert_matches(decode(batch, num_splits=num_splits), expected, dtype)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_zero_length_sequences_give_zeros(num_splits):
    batch = make_paged_batch([0, 40, 0], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=8, device=DEVICE)
    out = decode(batch, num_splits=num_splits)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert_matches(out, sdpa_decode(batch), torch.float32)
    empty = make_paged_batch([0, 0], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=8, device=DEVICE)
    assert empty.block_tables.shape == (2, 0)
    assert torch.equal(decode(empty, num_splits=num_splits), torch.zeros_like(empty.q))


def test_unreadable_block_ids_are_masked_not_dereferenced():
    """With value checks off, a -1 or too-large id in use must drop its tokens, not read memory."""
    batch = make_paged_batch([12, 12], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, device=DEVICE)
    batch.block_tables[0, 1] = -1
    batch.block_tables[1, 2] = 2**30
    out = decode(batch, check_values=False)
    assert torch.isfinite(out).all()
    # Expected: attention over the tokens whose blocks are still readable.
    keep = [torch.cat([torch.arange(0, 4), torch.arange(8, 12)]).to(DEVICE), torch.arange(0, 8, device=DEVICE)]
    batch.keys = [k[:, idx] for k, idx in zip(batch.keys, keep)]
    batch.values = [v[:, idx] for v, idx in zip(batch.values, keep)]
    assert_matches(out, sdpa_decode(batch), torch.float32)


def test_strided_inputs_and_int64_tables():
    """Caches that are views into one big tensor (as the allocator keeps layers), a strided q."""
    batch = make_paged_batch([33, 5], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=8, device=DEVICE)
    both = torch.stack([batch.k_cache, batch.v_cache])  # [2, blocks, heads, slots, d]
    wide_q = torch.zeros(2, 8, 32, device=DEVICE)
    wide_q[:, ::2] = batch.q
    out = paged_attention(
        wide_q[:, ::2], both[0], both[1], batch.block_tables.long(), batch.seq_lens.long(), backend="triton"
    )
    assert_matches(out, sdpa_decode(batch), torch.float32)
    transposed = batch.k_cache.transpose(2, 3).contiguous().transpose(2, 3)  # slot stride != head_dim
    out = paged_attention(batch.q, transposed, batch.v_cache, batch.block_tables, batch.seq_lens, backend="triton")
    assert_matches(out, sdpa_decode(batch), torch.float32)


def _rows_swapped_into_hidden_columns(batch):
    """The batch's table as a view of a wider one whose hidden columns hold the other
    sequence's real block ids: reading past a row's width would find real K/V there."""
    width = batch.block_tables.shape[1]
    wide = torch.full((2, 2 * width), -1, dtype=batch.block_tables.dtype, device=batch.block_tables.device)
    wide[:, :width] = batch.block_tables
    wide[0, width:] = batch.block_tables[1]
    wide[1, width:] = batch.block_tables[0]
    return wide[:, :width]


@pytest.mark.parametrize("num_splits", [1, 2])
def test_length_past_its_row_never_reads_another_row(num_splits):
    """Value checks off (the CUDA default): a length beyond its table row is cut to the row.

    Sequence 0 claims 16 tokens but its row holds 8: the next 8 would come from row 1's
    blocks if the kernel followed the length. Sequence 1 (the last row) claims 16 too and
    its row is a view whose hidden columns hold row 0's blocks.
    """
    batch = make_paged_batch([8, 8], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, device=DEVICE)
    expected = sdpa_decode(batch)  # each sequence over its own 8 tokens
    too_long = torch.tensor([16, 8], dtype=batch.seq_lens.dtype, device=DEVICE)
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, too_long,
                          backend="triton", num_splits=num_splits, check_values=False)
    assert_matches(out, expected, torch.float32)

    hidden = _rows_swapped_into_hidden_columns(batch)
    both_long = torch.tensor([16, 16], dtype=batch.seq_lens.dtype, device=DEVICE)
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, hidden, both_long,
                          backend="triton", num_splits=num_splits, check_values=False)
    assert_matches(out, expected, torch.float32)


def test_length_past_its_row_is_an_error_when_checked():
    batch = make_paged_batch([8, 8], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, device=DEVICE)
    too_long = torch.tensor([16, 8], dtype=batch.seq_lens.dtype, device=DEVICE)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 16 exceeds .* row of 2 blocks of 4 holds \(8\)"):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, too_long,
                        backend="triton", check_values=True)


def test_extend_length_past_its_row_never_reads_another_row():
    """The extend kernel cuts keys at the row's end too: the new tokens see only their row."""
    batch = make_paged_batch([8, 8], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4,
                             query_lens=[8, 8], device=DEVICE)
    hidden = _rows_swapped_into_hidden_columns(batch)
    # Claim 16 tokens, 8 of them new: the new tokens would sit at 8..15, past the row, so
    # none of them has a readable key; only the row's own 8 keys may ever be touched.
    both_long = torch.tensor([16, 16], dtype=batch.seq_lens.dtype, device=DEVICE)
    out = paged_attention_extend(batch.q, batch.k_cache, batch.v_cache, hidden, both_long,
                                 batch.query_start_loc, backend="triton", check_values=False)
    # Each new token j (position 8 + j) sees positions 0..7, the whole row.
    k = [kk for kk in batch.keys]
    v = [vv for vv in batch.values]
    expected = torch.cat([
        torch.nn.functional.scaled_dot_product_attention(
            batch.q[i * 8:(i + 1) * 8].float().transpose(0, 1)[None], k[i].float()[None], v[i].float()[None],
        )[0].transpose(0, 1)
        for i in range(2)
    ])
    assert_matches(out, expected, torch.float32)


def test_launches_set_fp_fusion_explicitly():
    """Triton 3.9 warns on stderr at the first compile of a launch that leaves it unset."""
    batch = make_paged_batch([40, 7], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=8,
                             query_lens=[40, 2], device=DEVICE)
    out = torch.empty_like(batch.q)
    launches = plan_decode(batch.q[:2], batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                           0.1, out[:2], num_splits=4)
    launches.append(plan_extend(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                batch.query_start_loc, 0.1, out, max_query_len=40))
    assert [launch.kernel for launch in launches] == [
        triton_kernel._paged_decode_kernel, triton_kernel._merge_splits_kernel, triton_kernel._paged_extend_kernel,
    ]
    assert all(launch.options["enable_fp_fusion"] is True for launch in launches)


def test_merge_split_cap():
    assert max_merge_splits(64) == 256 and max_merge_splits(128) == 128 and max_merge_splits(256) == 64
    assert max_merge_splits(80) == 128  # padded to 128 lanes
    batch = make_paged_batch([300, 5], num_q_heads=2, num_kv_heads=1, head_dim=128, block_size=16, device=DEVICE)
    out = torch.empty_like(batch.q)
    launches = plan_decode(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                           0.1, out, num_splits=256)
    assert launches[0].grid == (2, 1, 128) and launches[1].options["NUM_SPLITS"] == 128
    assert_matches(decode(batch, num_splits=256), sdpa_decode(batch), torch.float32)


def test_splits_are_sized_by_each_sequences_own_length():
    """A 200-token sequence in a table 1,000 tokens wide, cut into 4 splits: sized by its own
    length every split gets tokens (64, 64, 64, 8); sized by the table's width the first
    split would take all 200 and the other three would idle."""
    batch = make_paged_batch([200, 1000], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=8, device=DEVICE)
    out = torch.empty_like(batch.q)
    attend, merge = plan_decode(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                                0.25, out, num_splits=4)
    attend.run()
    part_sum = attend.args[8]  # [num_seqs, num_q_heads, num_splits]: each split's softmax denominator
    assert (part_sum[0] > 0).all() and (part_sum[1] > 0).all()
    merge.run()
    assert_matches(out, sdpa_decode(batch, scale=0.25), torch.float32)


def test_choose_num_splits():
    assert choose_num_splits(64, 8, 4096, num_sms=132) == 1  # enough programs already
    assert choose_num_splits(1, 8, 100, num_sms=132) == 1  # too short to split
    assert choose_num_splits(1, 8, 32768, num_sms=132) == 64  # 8 programs -> 512, capped by occupancy 64
    assert choose_num_splits(1, 8, 1024, num_sms=132) == 4  # capped by MIN_TOKENS_PER_SPLIT
    assert choose_num_splits(4, 8, 1 << 20, num_sms=132) == 16  # 32 programs * 16 >= 264
    for seqs in range(1, 40):
        splits = choose_num_splits(seqs, 2, 1 << 16, num_sms=132)
        assert 1 <= splits <= MAX_SPLITS and splits & (splits - 1) == 0


def test_auto_splits_run_the_split_path(monkeypatch):
    """Pretend to have many SMs so the heuristic splits, and check the answer still holds."""
    from paged_kv_lib.attention import triton_kernel

    monkeypatch.setattr(triton_kernel, "_num_sms", lambda device: 64)
    batch = make_paged_batch([600, 90], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=32, device=DEVICE)
    assert choose_num_splits(2, 1, batch.block_tables.shape[1] * 32, num_sms=64) > 1
    assert_matches(paged_attention_triton(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, 0.25), sdpa_decode(batch, scale=0.25), torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-without-interpreter message")
def test_cpu_tensors_without_interpreter_are_refused():
    code = (
        "import torch\n"
        "from paged_kv_lib.attention import paged_attention\n"
        "from paged_kv_lib.attention.testing import make_paged_batch\n"
        "b = make_paged_batch([3], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4)\n"
        "try:\n"
        "    paged_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, backend='triton')\n"
        "except RuntimeError as e:\n"
        "    print('RuntimeError', e)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "RuntimeError" in result.stdout and "TRITON_INTERPRET=1" in result.stdout


def test_interpreter_mode_matches_the_device():
    assert is_interpreting() == (not torch.cuda.is_available())


# --------------------------------------------------------------------------- extend
@st.composite
def extend_shapes(draw):
    shape = draw(kernel_shapes(max_len=48))
    shape["query_lens"] = [draw(st.sampled_from([0, 1, min(3, n), n, draw(st.integers(0, n))])) for n in shape["seq_lens"]]
    return shape


@settings(max_examples=EXTEND_EXAMPLES, deadline=None)
@given(shape=extend_shapes())
def test_triton_extend_matches_causal_sdpa(shape):
    batch = make_paged_batch(**shape)
    assert_matches(extend(batch), sdpa_extend(batch), shape["dtype"])


def test_extend_max_query_len_given_or_derived():
    batch = make_paged_batch([40, 7], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=4, query_lens=[40, 2], device=DEVICE)
    expected = sdpa_extend(batch)
    assert_matches(extend(batch), expected, torch.float32)
    assert_matches(extend(batch, max_query_len=40), expected, torch.float32)


@pytest.mark.parametrize("hint", [0, 1, 5])
def test_extend_short_max_query_len_hint_still_covers_every_token(hint):
    """Value checks off: a hint below the longest query (40) only shrinks the grid; each
    program loops over its sequence's real query tiles, so no output row stays unwritten."""
    batch = make_paged_batch([40, 7], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=4,
                             query_lens=[40, 2], device=DEVICE)
    out = extend(batch, max_query_len=hint, check_values=False)
    assert_matches(out, sdpa_extend(batch), torch.float32)


def test_extend_short_max_query_len_hint_is_an_error_when_checked():
    batch = make_paged_batch([40, 7], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=4,
                             query_lens=[40, 2], device=DEVICE)
    with pytest.raises(ValueError, match="max_query_len=5 is less than the longest query \\(40\\)"):
        extend(batch, max_query_len=5, check_values=True)
    with pytest.raises(ValueError, match="max_query_len must be >= 0, got -1"):
        paged_attention_extend_triton(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                                      batch.seq_lens, batch.query_start_loc, 0.1, max_query_len=-1)


def test_extend_grid_capped_in_its_second_dimension(monkeypatch):
    """CUDA allows 65,535 programs in a grid's second dimension; past it, programs take
    several query tiles each. A cap of 2 exercises the same path on a small batch."""
    monkeypatch.setattr(triton_kernel, "MAX_GRID_YZ", 2)
    batch = make_paged_batch([40, 7], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4,
                             query_lens=[40, 7], device=DEVICE)
    launch = plan_extend(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
                         batch.query_start_loc, 0.1, torch.empty_like(batch.q), max_query_len=40)
    assert launch.grid[1] == 2 and 40 > 2 * launch.options["BLOCK_Q"]
    assert_matches(extend(batch), sdpa_extend(batch), torch.float32)
