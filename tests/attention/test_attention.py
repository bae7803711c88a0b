"""Paged attention, torch backend and public API: SDPA agreement, the allocator, input errors."""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv_lib.attention import (
    TRITON_HINT,
    gather_kv,
    paged_attention,
    paged_attention_extend,
    resolve_backend,
    triton_available,
)
from paged_kv_lib.attention import api
from paged_kv_lib.attention.batched import paged_attention_batched, paged_attention_extend_batched
from paged_kv_lib.attention.reference import paged_attention_extend_reference, paged_attention_reference
from paged_kv_lib.attention.testing import TOLERANCES, make_paged_batch, sdpa_decode, sdpa_extend

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The end-to-end tests use the GPU when there is one (Triton needs it unless interpreting).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_matches(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[dtype])


@st.composite
def batch_shapes(draw, max_len: int = 80, max_seqs: int = 4):
    """Shapes for a random batch: ragged lengths (1 token included) and GQA ratios."""
    num_kv_heads = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4]))
    return dict(
        seq_lens=draw(st.lists(st.integers(1, max_len), min_size=1, max_size=max_seqs)),
        num_kv_heads=num_kv_heads,
        num_q_heads=num_kv_heads * group,
        head_dim=draw(st.sampled_from([16, 32, 48, 64])),
        block_size=draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 256])),
        dtype=draw(st.sampled_from(DTYPES)),
        spare_blocks=draw(st.integers(0, 3)),
        pad_columns=draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 2**16)),
    )


# --------------------------------------------------------------------------- decode
@settings(max_examples=60, deadline=None)
@given(shape=batch_shapes())
def test_torch_decode_matches_sdpa(shape):
    batch = make_paged_batch(**shape)
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="torch")
    assert_matches(out, sdpa_decode(batch), shape["dtype"])


def test_decode_scale_is_applied():
    batch = make_paged_batch([5, 9], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens)
    out = paged_attention(*args, scale=0.3, backend="torch")
    assert_matches(out, sdpa_decode(batch, scale=0.3), torch.float32)
    assert not torch.allclose(out, paged_attention(*args, backend="torch"))


def test_zero_length_sequence_gives_zeros():
    batch = make_paged_batch([0, 7, 0], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=4)
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="torch")
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert_matches(out, sdpa_decode(batch), torch.float32)


def test_single_token_returns_its_value():
    """With one cached token the softmax weight is 1: the output is that token's V."""
    batch = make_paged_batch([1], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=8)
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="torch")
    expected = batch.values[0][:, 0].repeat_interleave(2, dim=0)
    torch.testing.assert_close(out[0], expected)


def test_empty_batch():
    batch = make_paged_batch([3], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4)
    out = paged_attention(
        batch.q[:0], batch.k_cache, batch.v_cache, batch.block_tables[:0], batch.seq_lens[:0], backend="torch"
    )
    assert out.shape == (0, 2, 16)


def test_gather_kv_restores_the_contiguous_tokens():
    batch = make_paged_batch([13, 4], num_q_heads=2, num_kv_heads=2, head_dim=16, block_size=4, spare_blocks=3)
    for i, n in enumerate(batch.seq_lens.tolist()):
        assert torch.equal(gather_kv(batch.k_cache, batch.block_tables[i], n), batch.keys[i])
        assert torch.equal(gather_kv(batch.v_cache, batch.block_tables[i], n), batch.values[i])


# --------------------------------------------------------------------------- extend
@st.composite
def extend_shapes(draw):
    shape = draw(batch_shapes(max_len=40))
    shape["query_lens"] = [draw(st.integers(0, n)) for n in shape["seq_lens"]]
    return shape


@settings(max_examples=50, deadline=None)
@given(shape=extend_shapes())
def test_torch_extend_matches_causal_sdpa(shape):
    batch = make_paged_batch(**shape)
    out = paged_attention_extend(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
        batch.query_start_loc, backend="torch",
    )
    assert_matches(out, sdpa_extend(batch), shape["dtype"])


def test_extend_with_one_query_equals_decode():
    batch = make_paged_batch([9, 1, 30], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=8, query_lens=[1, 1, 1])
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens)
    extend = paged_attention_extend(*args, batch.query_start_loc, backend="torch")
    torch.testing.assert_close(extend, paged_attention(*args, backend="torch"))


def test_extend_is_causal():
    """Changing the last token's K/V must leave every earlier query's output unchanged."""
    batch = make_paged_batch([6], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=2, query_lens=[6])
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc)
    before = paged_attention_extend(*args, backend="torch")
    last_block = int(batch.block_tables[0, 2])
    batch.k_cache[last_block, :, 1] += 5.0
    batch.v_cache[last_block, :, 1] -= 5.0
    after = paged_attention_extend(*args, backend="torch")
    torch.testing.assert_close(after[:5], before[:5])
    assert not torch.allclose(after[5], before[5])


# ------------------------------------------------------- batched torch vs the reference
def _reference_shapes(draw, with_queries: bool):
    """Ragged fp32 batches, zero-length sequences included, for the batched-vs-reference tests."""
    num_kv_heads = draw(st.integers(1, 3))
    lens = draw(st.lists(st.integers(0, 70), min_size=1, max_size=5))
    shape = dict(
        seq_lens=lens,
        num_kv_heads=num_kv_heads,
        num_q_heads=num_kv_heads * draw(st.sampled_from([1, 2, 4])),
        head_dim=draw(st.sampled_from([16, 32, 64])),
        block_size=draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32])),
        spare_blocks=draw(st.integers(0, 3)),
        pad_columns=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**16)),
    )
    if with_queries:
        shape["query_lens"] = [draw(st.integers(0, n)) for n in lens]
    return shape


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_batched_decode_equals_the_reference(data):
    """Every unowned slot (tails, spare blocks, what -1 padding reads) holds NaN: none may leak."""
    batch = make_paged_batch(**_reference_shapes(data.draw, with_queries=False), poison=True)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens)
    out = paged_attention_batched(*args)
    assert not out.isnan().any()
    torch.testing.assert_close(out, paged_attention_reference(*args), rtol=1e-5, atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_batched_extend_equals_the_reference(data):
    batch = make_paged_batch(**_reference_shapes(data.draw, with_queries=True), poison=True)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc)
    out = paged_attention_extend_batched(*args)
    assert not out.isnan().any()
    torch.testing.assert_close(out, paged_attention_extend_reference(*args), rtol=1e-5, atol=1e-6)


def test_batched_padding_reads_block_zero_and_ignores_it():
    """A -1 table entry is read as block 0; poisoning block 0 must not change the answer."""
    batch = make_paged_batch([3, 20], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, spare_blocks=1)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens)
    owner = int(torch.nonzero(batch.block_tables == 0)[0, 0]) if bool((batch.block_tables == 0).any()) else None
    before = paged_attention_batched(*args)
    if owner is None:  # block 0 is a spare: fill it with NaN outright
        batch.k_cache[0] = float("nan")
        batch.v_cache[0] = float("nan")
    after = paged_attention_batched(*args)
    assert not after.isnan().any()
    torch.testing.assert_close(after, before)
    torch.testing.assert_close(after, paged_attention_reference(*args))


@pytest.mark.parametrize("extend", [False, True], ids=["decode", "extend"])
def test_batched_buckets_a_ragged_batch_and_still_equals_the_reference(extend, monkeypatch):
    """24 sequences of very different lengths are cut into buckets; the answer does not change."""
    from paged_kv_lib.attention import batched
    from paged_kv_lib.attention.batched import plan_batch

    monkeypatch.setattr(batched, "BUCKET_OVERHEAD", 512)  # cheap buckets: this small batch is cut
    lens = [3 + (i * 97) % 400 for i in range(24)]
    query_lens = [max(1, n // (1 + i % 3)) for i, n in enumerate(lens)] if extend else None
    batch = make_paged_batch(lens, num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                             query_lens=query_lens, spare_blocks=2, pad_columns=1, poison=True)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens)
    qsl = batch.query_start_loc if extend else None
    plan = plan_batch(batch.block_tables, batch.seq_lens, 2, 8, qsl)
    assert len(plan.buckets) > 1
    covered = torch.cat([b.seqs for b in plan.buckets]).sort().values
    assert torch.equal(covered, torch.arange(24))
    if extend:
        out, expected = paged_attention_extend_batched(*args, qsl), paged_attention_extend_reference(*args, qsl)
    else:
        out, expected = paged_attention_batched(*args), paged_attention_reference(*args)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), decodes=st.integers(1, 5), chunks=st.integers(1, 3))
def test_an_engine_plan_masks_without_clearing_and_buckets_decodes_apart(data, decodes, chunks):
    """A step of decodes beside prompt chunks, on a finite cache: the plan clears nothing, same answer."""
    from paged_kv_lib.attention.batched import attend, plan_batch

    block_size = data.draw(st.sampled_from([1, 4, 16]))
    lens = [data.draw(st.integers(1, 60)) for _ in range(decodes + chunks)]
    query_lens = [1] * decodes + [data.draw(st.integers(2, max(2, n))) if n > 1 else 1 for n in lens[decodes:]]
    order = data.draw(st.permutations(range(len(lens))))
    lens, query_lens = [lens[i] for i in order], [query_lens[i] for i in order]
    # poison=False: unowned slots hold zeros, and stale finite values are planted below
    batch = make_paged_batch(lens, num_q_heads=4, num_kv_heads=2, head_dim=8, block_size=block_size,
                             query_lens=query_lens, spare_blocks=2, pad_columns=1, poison=False)
    batch.k_cache.add_(torch.randn_like(batch.k_cache) * (batch.k_cache == 0))  # stale K/V, finite
    batch.v_cache.add_(torch.randn_like(batch.v_cache) * (batch.v_cache == 0))
    args = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, batch.query_start_loc)
    plan = plan_batch(batch.block_tables, batch.seq_lens, 2, block_size, batch.query_start_loc)
    assert all(b.unseen_blocks.numel() == 0 and b.unseen_slots.numel() == 0 for b in plan.buckets)
    if 1 in query_lens and max(query_lens) > 1:  # one-token rows never share a bucket with a chunk
        for bucket in plan.buckets:
            kinds = {query_lens[i] == 1 for i in bucket.seqs.tolist()}
            assert len(kinds) == 1 and (bucket.pack is None) == kinds.pop()
    out = attend(batch.q, batch.k_cache, batch.v_cache, plan)
    torch.testing.assert_close(out, paged_attention_extend_reference(*args), rtol=1e-5, atol=1e-5)


def test_torch_backend_runs_the_batched_path(monkeypatch):
    calls = []
    real = api.paged_attention_batched
    monkeypatch.setattr(api, "paged_attention_batched", lambda *a: calls.append(1) or real(*a))
    batch = make_paged_batch([5, 9], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4)
    paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="torch")
    assert calls == [1]


# ------------------------------------------------------------------ with the allocator
def _allocator_case(dtype):
    from paged_kv_lib import PagedKVCacheAllocator

    torch.manual_seed(0)
    num_kv_heads, head_dim, block_size = 2, 32, 4
    alloc = PagedKVCacheAllocator(32, block_size, num_kv_heads, head_dim, dtype, DEVICE, num_layers=2)
    # A short-lived sequence first, freed, so the others get non-contiguous blocks.
    alloc.allocate_for_sequence(99, 9)
    lens = {0: 11, 1: 1, 2: 17}
    originals = {}
    for seq_id, n in lens.items():
        alloc.allocate_for_sequence(seq_id, n)
        if seq_id == 0:
            alloc.free_sequence(99)
        k = torch.randn(n, num_kv_heads, head_dim).to(dtype).to(DEVICE)
        v = torch.randn(n, num_kv_heads, head_dim).to(dtype).to(DEVICE)
        alloc.write_kv(seq_id, list(range(n)), k, v, layer=1)
        originals[seq_id] = (k, v)
    seq_ids = list(lens)
    block_tables = alloc.block_table_tensor(seq_ids)
    seq_lens = torch.tensor([alloc.get_num_tokens(s) for s in seq_ids], dtype=torch.int32, device=DEVICE)
    return alloc, originals, seq_ids, block_tables, seq_lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(not triton_available(), reason="triton not installed"))])
def test_allocator_end_to_end(dtype, backend):
    pytest.importorskip("paged_kv_lib.allocator")
    alloc, originals, seq_ids, block_tables, seq_lens = _allocator_case(dtype)
    q = torch.randn(len(seq_ids), 8, 32).to(dtype).to(DEVICE)
    out = paged_attention(q, alloc.k_caches[1], alloc.v_caches[1], block_tables, seq_lens, backend=backend)
    for row, seq_id in enumerate(seq_ids):
        k, v = originals[seq_id]
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[row].float()[None, :, None], k.float().transpose(0, 1)[None], v.float().transpose(0, 1)[None],
            enable_gqa=True,
        )[0, :, 0]
        assert_matches(out[row], expected, dtype)
    # Layer 0 was never written: attending there must not give layer 1's answer.
    other = paged_attention(q, alloc.k_caches[0], alloc.v_caches[0], block_tables, seq_lens, backend=backend)
    assert not torch.allclose(other.float(), out.float())


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(not triton_available(), reason="triton not installed"))])
def test_allocator_end_to_end_extend(backend):
    pytest.importorskip("paged_kv_lib.allocator")
    alloc, originals, seq_ids, block_tables, seq_lens = _allocator_case(torch.float32)
    query_lens = [3, 1, 17]
    q = torch.randn(sum(query_lens), 4, 32, device=DEVICE)
    qsl = torch.tensor([0, 3, 4, 21], dtype=torch.int32, device=DEVICE)
    out = paged_attention_extend(q, alloc.k_caches[1], alloc.v_caches[1], block_tables, seq_lens, qsl, backend=backend)
    for row, seq_id in enumerate(seq_ids):
        k, v = originals[seq_id]
        n_all, first, last = k.shape[0], int(qsl[row]), int(qsl[row + 1])
        q_pos = torch.arange(n_all - (last - first), n_all, device=DEVICE)
        mask = torch.arange(n_all, device=DEVICE)[None, :] <= q_pos[:, None]
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[first:last].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask, enable_gqa=True,
        )[0].transpose(0, 1)
        assert_matches(out[first:last], expected, torch.float32)


# ------------------------------------------------------------------------- backends
def test_auto_backend_is_torch_on_cpu():
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("torch", torch.device("cuda")) == "torch"


def test_auto_backend_picks_triton_for_cuda_tensors_when_installed(monkeypatch):
    monkeypatch.setattr(api, "triton_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    monkeypatch.setattr(api, "triton_available", lambda: False)
    assert resolve_backend("auto", torch.device("cuda")) == "torch"


def test_triton_backend_without_triton_says_how_to_install(monkeypatch):
    monkeypatch.setattr(api, "triton_available", lambda: False)
    batch = make_paged_batch([3], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4)
    with pytest.raises(ImportError, match=r"pip install 'paged-kv\[triton\]'"):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens, backend="triton")
    assert "pip install 'paged-kv[triton]'" in TRITON_HINT


def test_library_imports_without_triton():
    """Hide triton from a fresh interpreter: the torch backend must still work."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from paged_kv_lib.attention import paged_attention\n"
        "from paged_kv_lib.attention.testing import make_paged_batch\n"
        "b = make_paged_batch([3], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4)\n"
        "args = (b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens)\n"
        "print(paged_attention(*args, backend='torch').shape)\n"
        "try:\n"
        "    paged_attention(*args, backend='triton')\n"
        "except ImportError as e:\n"
        "    print('ImportError', e)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "torch.Size([1, 2, 16])" in result.stdout
    assert "paged-kv[triton]" in result.stdout


# --------------------------------------------------------------------------- errors
def _args(**overrides):
    batch = make_paged_batch([5, 3], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4, spare_blocks=2)
    args = dict(q=batch.q, k_cache=batch.k_cache, v_cache=batch.v_cache, block_tables=batch.block_tables, seq_lens=batch.seq_lens)
    args.update(overrides)
    return args


def _call(args, **kwargs):
    return paged_attention(args["q"], args["k_cache"], args["v_cache"], args["block_tables"], args["seq_lens"], **kwargs)


@pytest.mark.parametrize(
    "mutate, error, message",
    [
        (lambda a: a.update(q=a["q"].numpy()), TypeError, "q must be a torch.Tensor"),
        (lambda a: a.update(q=a["q"][0]), ValueError, "q must be 3-D"),
        (lambda a: a.update(k_cache=a["k_cache"][0]), ValueError, "k_cache must be 4-D"),
        (lambda a: a.update(v_cache=a["v_cache"][:1]), ValueError, "v_cache shape"),
        (lambda a: a.update(q=a["q"].double()), TypeError, "q dtype must be one of"),
        (lambda a: a.update(k_cache=a["k_cache"].half()), TypeError, "k_cache dtype torch.float16 differs"),
        (lambda a: a.update(v_cache=a["v_cache"].half()), TypeError, "v_cache dtype torch.float16 differs"),
        (lambda a: a.update(q=a["q"][:, :3]), ValueError, r"num_q_heads \(3\) must be a multiple of num_kv_heads \(2\)"),
        (lambda a: a.update(q=torch.zeros(2, 4, 32)), ValueError, "q head_dim 32 differs from the cache head_dim 16"),
        (lambda a: a.update(q=torch.zeros(2, 4, 8), k_cache=torch.zeros(4, 2, 4, 8), v_cache=torch.zeros(4, 2, 4, 8)), ValueError, "head_dim must be from 16 to 256, got 8"),
        (lambda a: a.update(q=torch.zeros(2, 2, 512), k_cache=torch.zeros(4, 2, 4, 512), v_cache=torch.zeros(4, 2, 4, 512)), ValueError, "head_dim must be from 16 to 256, got 512"),
        (lambda a: a.update(block_tables=a["block_tables"].float()), TypeError, "block_tables must be int32 or int64"),
        (lambda a: a.update(block_tables=a["block_tables"][0]), ValueError, "block_tables must have 2 dimension"),
        (lambda a: a.update(block_tables=a["block_tables"][:1]), ValueError, "block_tables has 1 rows, expected 2"),
        (lambda a: a.update(seq_lens=a["seq_lens"][:1]), ValueError, "seq_lens has 1 entries, expected 2"),
        (lambda a: a.update(seq_lens=a["seq_lens"].float()), TypeError, "seq_lens must be int32 or int64"),
        (lambda a: a.update(seq_lens=torch.tensor([5, -1], dtype=torch.int32)), ValueError, r"seq_lens\[1\] = -1 is negative"),
        (lambda a: a.update(seq_lens=torch.tensor([5, 9], dtype=torch.int32)), ValueError, r"seq_lens\[1\] = 9 exceeds .* \(8\)"),
        (lambda a: a["block_tables"].__setitem__((0, 1), -1), ValueError, r"block_tables\[0, 1\] = -1 is not a block id in \[0, 5\)"),
        (lambda a: a["block_tables"].__setitem__((1, 0), 5), ValueError, r"block_tables\[1, 0\] = 5 is not a block id"),
    ],
)
def test_decode_input_errors(mutate, error, message):
    args = _args()
    mutate(args)
    with pytest.raises(error, match=message):
        _call(args, backend="torch")


def test_device_mismatch_is_reported():
    args = _args(seq_lens=_args()["seq_lens"].to("meta"))
    with pytest.raises(ValueError, match="seq_lens is on meta, but q is on cpu"):
        _call(args, backend="torch")


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(scale=0.0), ValueError, "scale must be positive and finite, got 0.0"),
        (dict(scale=math.inf), ValueError, "scale must be positive and finite"),
        (dict(scale="0.5"), TypeError, "scale must be a float or None"),
        (dict(scale=True), TypeError, "scale must be a float or None"),
        (dict(backend="cuda"), ValueError, r"backend must be one of \('auto', 'torch', 'triton'\), got 'cuda'"),
        (dict(num_splits=3), ValueError, "num_splits must be a power of two from 1 to 256, got 3"),
        (dict(num_splits=512), ValueError, "num_splits must be a power of two from 1 to 256, got 512"),
        (dict(num_splits=2.0), TypeError, "num_splits must be an int or None"),
        (dict(check_values="yes"), TypeError, "check_values must be a bool or None"),
    ],
)
def test_option_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        _call(_args(), **kwargs)


def test_value_checks_can_be_skipped():
    """check_values=False skips the (syncing) content checks; the reference then trusts its input."""
    args = _args(seq_lens=torch.tensor([5, -1], dtype=torch.int32))
    with pytest.raises(ValueError):
        _call(args, backend="torch")
    _call(_args(), backend="torch", check_values=False)


def _extend_args():
    batch = make_paged_batch([5, 3], num_q_heads=2, num_kv_heads=1, head_dim=16, block_size=4, query_lens=[2, 3])
    return batch


@pytest.mark.parametrize(
    "qsl, error, message",
    [
        (torch.tensor([0, 2, 5, 5], dtype=torch.int32), ValueError, "query_start_loc has 4 entries, expected num_seqs \\+ 1 = 3"),
        (torch.tensor([0, 2, 5]).float(), TypeError, "query_start_loc must be int32 or int64"),
        (torch.tensor([1, 2, 5], dtype=torch.int32), ValueError, "query_start_loc must start at 0 and end at q.shape\\[0\\] = 5"),
        (torch.tensor([0, 2, 4], dtype=torch.int32), ValueError, "must start at 0 and end at"),
        (torch.tensor([0, 6, 5], dtype=torch.int32), ValueError, "query_start_loc decreases at index 2"),
        (torch.tensor([0, 1, 5], dtype=torch.int32), ValueError, r"sequence 1 has 4 new query tokens but seq_lens\[1\] = 3"),
    ],
)
def test_extend_input_errors(qsl, error, message):
    b = _extend_args()
    with pytest.raises(error, match=message):
        paged_attention_extend(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, qsl, backend="torch")


def test_extend_max_query_len_errors():
    b = _extend_args()
    args = (b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc)
    with pytest.raises(ValueError, match="max_query_len=2 is less than the longest query \\(3\\)"):
        paged_attention_extend(*args, max_query_len=2, backend="torch")
    with pytest.raises(TypeError, match="max_query_len must be an int or None"):
        paged_attention_extend(*args, max_query_len=2.5, backend="torch")
    with pytest.raises(TypeError, match="seq_lens must be a torch.Tensor"):
        paged_attention_extend(b.q, b.k_cache, b.v_cache, b.block_tables, [5, 3], b.query_start_loc)
